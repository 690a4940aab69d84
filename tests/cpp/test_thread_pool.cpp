// The compute team (common/thread_pool.h) through parallel_for: every index once, the first exception rethrown
// after every task ran, nested loops inline, concurrent callers with teams of their own, team size changes.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/parallel.h"
#include "moe_cpu/threads.h"

namespace moe_cpu {
namespace {

struct Threads {  // sets the calling thread's team size for one test
  explicit Threads(int n) { set_thread_num_threads(n); }
  ~Threads() { set_thread_num_threads(0); }
};

TEST(ComputeTeam, RunsEveryIndexOnceAtAnySize) {
  for (int t : {1, 2, 3, 8}) {
    Threads th(t);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (auto& h : hits) h = 0;
      parallel_for(n, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "t=" << t << " n=" << n << " i=" << i;
    }
  }
}

TEST(ComputeTeam, RethrowsTheFirstExceptionAfterEveryTask) {
  Threads th(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel_for(100, [&](int64_t i) {
                 ran.fetch_add(1);
                 if (i % 10 == 3) throw std::runtime_error("task failed");
               }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 100);
  std::atomic<int> again{0};  // the team is usable afterwards
  parallel_for(50, [&](int64_t) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 50);
}

TEST(ComputeTeam, NestedLoopsRunInline) {
  Threads th(2);
  std::atomic<int> inner{0};
  parallel_for(8, [&](int64_t) {
    const std::thread::id me = std::this_thread::get_id();
    parallel_for(16, [&](int64_t) {
      EXPECT_EQ(std::this_thread::get_id(), me);
      inner.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 8 * 16);
}

TEST(ComputeTeam, ConcurrentCallersAndChangingSizes) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 200; ++rep) {
        Threads th(1 + (rep + c) % 3);
        parallel_for(37, [&](int64_t i) { total.fetch_add(i); });
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t(4) * 200 * (36 * 37 / 2));
}

}  // namespace
}  // namespace moe_cpu
