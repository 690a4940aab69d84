// The compute team (common/thread_pool.h) through parallel_for: every index once, the first exception rethrown
// after every task ran, nested loops inline, concurrent callers with teams of their own, team size changes; a
// woken worker's move off its caller's CPU (leave_cpu).
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/parallel.h"
#include "common/thread_pool.h"

#ifdef __linux__
#include <sched.h>
#endif
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

#ifdef __linux__
// On a thread running on CPU c0 and allowed on others, leave_cpu(c0) moves it off c0 and leaves its affinity as it
// was; allowed on c0 alone, it stays.
TEST(ComputeTeam, LeaveCpuMovesOffThatCpuAndKeepsTheAffinity) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  int c0 = 0;
  while (!CPU_ISSET(c0, &all)) ++c0;
  int before = -1, after = -1;
  bool same_mask = false;
  std::thread t([&] {
    cpu_set_t one, now;
    CPU_ZERO(&one);
    CPU_SET(c0, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return;
    before = sched_getcpu();
    sched_setaffinity(0, sizeof all, &all);  // allowed everywhere again, still on c0
    leave_cpu(c0);
    after = sched_getcpu();
    sched_getaffinity(0, sizeof now, &now);
    same_mask = CPU_EQUAL(&now, &all);
  });
  t.join();
  ASSERT_EQ(before, c0);
  EXPECT_TRUE(same_mask);
  if (CPU_COUNT(&all) >= 2) EXPECT_NE(after, c0);
  else EXPECT_EQ(after, c0);
}
#endif

}  // namespace
}  // namespace moe_cpu
