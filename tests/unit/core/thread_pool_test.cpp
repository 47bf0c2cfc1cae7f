#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

namespace osprey {
namespace {

// Every index in [0, n) is visited exactly once, for many n and pool sizes.
TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 12345}) {
      for (int64_t grain : {1, 5, 100000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e) {
              ASSERT_LE(0, b);
              ASSERT_LT(b, e);
              ASSERT_LE(e, n);
              for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
            },
            grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(ThreadPool, UsesSeveralThreadsAndValidIndices) {
  ThreadPool pool(4, /*spin_us=*/1000);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::set<int> indices;
  std::atomic<int> entered{0};
  // Each chunk waits (up to 5 s) until all four chunks have started, which
  // only happens when four different threads run them.
  pool.parallel_for(4, [&](int64_t, int64_t) {
    entered.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (entered.load() < 4 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    indices.insert(ThreadPool::thread_index());
  });
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(indices, (std::set<int>{0, 1, 2, 3}));
}

TEST(ThreadPool, ManySmallDispatchesAndSleepWake) {
  ThreadPool pool(2, /*spin_us=*/20);
  int64_t total = 0;
  for (int rep = 0; rep < 20000; ++rep) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(8, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
    total += sum.load();
    if (rep % 5000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers go to sleep
  }
  EXPECT_EQ(total, 20000 * 8);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> count{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { count.fetch_add(e2 - b2); });
    }
  });
  EXPECT_EQ(count.load(), 40);
}

TEST(ThreadPool, ConcurrentDispatchersBothComplete) {
  ThreadPool pool(2);
  std::atomic<int64_t> a{0}, b{0};
  std::thread other([&] {
    for (int i = 0; i < 2000; ++i) pool.parallel_for(16, [&](int64_t s, int64_t e) { a.fetch_add(e - s); });
  });
  for (int i = 0; i < 2000; ++i) pool.parallel_for(16, [&](int64_t s, int64_t e) { b.fetch_add(e - s); });
  other.join();
  EXPECT_EQ(a.load(), 2000 * 16);
  EXPECT_EQ(b.load(), 2000 * 16);
}

TEST(ThreadPool, DefaultThreadCountIsHardware) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace osprey
