// ThreadPool: persistent workers for data-parallel loops, tuned for many small
// dispatches (decode issues ~300 per token). The calling thread takes part.
//
// Wake-up protocol: a dispatch publishes the job under a new generation in an
// atomic state word. Idle workers spin on it for spin_us before sleeping on a
// condition variable, so back-to-back dispatches cost about a microsecond and
// an idle pool costs no CPU. Workers join a job only while it is open; the
// caller closes it once every chunk is claimed and waits only for the workers
// that joined, so a worker the OS has not scheduled (an oversubscribed
// machine) never stalls a dispatch. A dispatch allocates nothing.
//
// Invariants: one dispatch at a time. A parallel_for issued from inside a job
// (nested) or while another thread's dispatch is running runs inline on the
// calling thread, so it never deadlocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace osprey {

class ThreadPool {
 public:
  // num_threads: total threads including the caller; <= 0 means all cores.
  // spin_us: how long an idle worker polls before sleeping.
  explicit ThreadPool(int num_threads, int spin_us = 200);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Index of the calling thread within the pool running its current job:
  // 0 for the dispatching thread, 1..num_threads-1 for workers. Valid inside
  // a parallel_for body; use it to pick per-thread scratch.
  static int thread_index();

  // Calls fn(begin, end) on disjoint chunks covering [0, n); returns when all
  // are done. Chunks are at least `grain` long (except possibly the last) and
  // handed out dynamically, at most 4 per thread.
  template <class F>
  void parallel_for(int64_t n, F&& fn, int64_t grain = 1) {
    using Fn = std::remove_reference_t<F>;
    run(
        n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Non-template entry: fn(ctx, begin, end).
  using RawFn = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, int64_t grain, RawFn fn, void* ctx);

 private:
  void worker_main(int index);
  void work_on_current_job();

  int num_threads_ = 1;
  int spin_us_ = 200;
  std::vector<std::thread> workers_;

  // Current job; written by the dispatcher while no worker is joined.
  RawFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunks_ = 0;
  uint32_t generation_counter_ = 0;  // dispatcher-only
  alignas(64) std::atomic<int64_t> next_chunk_{0};
  // [generation:32][closed:1][joined workers:31]. A worker joins a job (and
  // may touch its fields) only while it is open; the dispatcher closes it once
  // every chunk is claimed and then waits for joined workers alone, so a
  // worker the OS has not scheduled yet never delays a dispatch.
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int> num_sleeping_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};  // a dispatch is in progress
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace osprey
