#include "server/parallel_for.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ThreadPoolTest, CoversTheRangeOnceWithAlignedPieces) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{1000}, size_t{100003}}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, 16, [&](size_t begin, size_t end) {
        EXPECT_EQ(begin % 16, 0u);
        for (size_t i = begin; i < end; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
    }
  }
}

TEST(ThreadPoolTest, UsesSeveralThreadsAndSerialisesCallers) {
  ThreadPool pool(3);
  std::atomic<int> in_flight{0}, max_in_flight{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        pool.ParallelFor(3000, 16, [&](size_t, size_t) {
          int now = ++in_flight;
          int prev = max_in_flight.load();
          while (now > prev && !max_in_flight.compare_exchange_weak(prev, now)) {
          }
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          --in_flight;
        });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_GE(max_in_flight.load(), 2);
  EXPECT_LE(max_in_flight.load(), 3);  // One call's pieces at a time.
}

}  // namespace
}  // namespace shardopt
