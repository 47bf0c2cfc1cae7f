#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OSP_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define OSP_CPU_RELAX() asm volatile("yield")
#else
#define OSP_CPU_RELAX() ((void)0)
#endif

namespace osprey {
namespace {

thread_local int t_thread_index = 0;
thread_local bool t_in_job = false;

}  // namespace

int ThreadPool::thread_index() {
  return t_thread_index;
}

ThreadPool::ThreadPool(int num_threads, int spin_us) : spin_us_(std::max(0, spin_us)) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = num_threads;
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

namespace {

constexpr uint64_t kClosed = uint64_t{1} << 31;
constexpr uint64_t kJoinedMask = kClosed - 1;
inline uint32_t gen_of(uint64_t state) {
  return static_cast<uint32_t>(state >> 32);
}

}  // namespace

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    // A new, already closed generation wakes every worker without a job.
    state_.store((static_cast<uint64_t>(generation_counter_ + 1) << 32) | kClosed);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work_on_current_job() {
  const int64_t chunks = job_chunks_;
  const int64_t n = job_n_;
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= chunks) break;
    const int64_t b = n * c / chunks;
    const int64_t e = n * (c + 1) / chunks;
    if (b < e) job_fn_(job_ctx_, b, e);
  }
}

void ThreadPool::worker_main(int index) {
  t_thread_index = index;
  uint32_t seen = 0;  // generation at construction; a job may be published before this runs
  for (;;) {
    // Spin, then sleep, until a new generation is published.
    uint64_t s = state_.load(std::memory_order_acquire);
    if (gen_of(s) == seen) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
      for (int iter = 1;; ++iter) {
        OSP_CPU_RELAX();
        s = state_.load(std::memory_order_acquire);
        if (gen_of(s) != seen) break;
        if ((iter & 255) == 0 && std::chrono::steady_clock::now() >= deadline) break;
      }
    }
    if (gen_of(s) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      num_sleeping_.fetch_add(1);  // seq_cst: pairs with the dispatcher's store then load
      while (gen_of(s = state_.load()) == seen) cv_.wait(lock);
      num_sleeping_.fetch_sub(1);
    }
    seen = gen_of(s);
    if (stop_.load(std::memory_order_acquire)) return;
    // Join the job if it is still open (same generation, not closed).
    bool joined = false;
    while (gen_of(s) == seen && (s & kClosed) == 0) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    t_in_job = true;
    work_on_current_job();
    t_in_job = false;
    state_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::run(int64_t n, int64_t grain, RawFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t chunks = std::min<int64_t>(max_chunks, 4 * static_cast<int64_t>(num_threads_));
  if (num_threads_ == 1 || chunks == 1 || t_in_job || busy_.exchange(true, std::memory_order_acquire)) {
    fn(ctx, 0, n);
    return;
  }
  // No worker is joined here: the previous job was closed and drained.
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_n_ = n;
  job_chunks_ = chunks;
  next_chunk_.store(0, std::memory_order_relaxed);
  ++generation_counter_;
  state_.store(static_cast<uint64_t>(generation_counter_) << 32);  // seq_cst: open, publishes the fields
  if (num_sleeping_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    cv_.notify_all();
  }

  const int saved_index = t_thread_index;
  t_thread_index = 0;
  t_in_job = true;
  work_on_current_job();
  t_in_job = false;
  t_thread_index = saved_index;

  // Every chunk is claimed: close the job and wait for the workers inside it.
  state_.fetch_or(kClosed, std::memory_order_acq_rel);
  for (int iter = 1; (state_.load(std::memory_order_acquire) & kJoinedMask) != 0; ++iter) {
    if (iter < 4096) {
      OSP_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  busy_.store(false, std::memory_order_release);
}

}  // namespace osprey
