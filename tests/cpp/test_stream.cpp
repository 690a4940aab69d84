// test_stream.cpp — the Stream worker: order, errors, timeouts, close with queued work, many submitters
// (run under ASan / UBSan with the rest of the suite).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "moe_cpu/errors.h"
#include "moe_cpu/stream.h"
#include "moe_cpu/threads.h"

namespace moe_cpu {
namespace {

std::shared_ptr<StreamTask> task(std::function<void()> f) { return std::make_shared<StreamTask>(std::move(f)); }
// A task that runs until `go` is set.
std::shared_ptr<StreamTask> gated_task(std::atomic<bool>& go) {
  return task([&go] { while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Stream, RunsTasksInSubmissionOrderOnItsOwnTeam) {
  Stream s(3, 50);
  std::vector<int> order;
  std::vector<std::shared_ptr<StreamTask>> ts;
  int team = 0;
  for (int i = 0; i < 100; ++i) ts.push_back(task([&order, i] { order.push_back(i); }));
  ts.push_back(task([&team] { team = get_num_threads(); }));
  for (auto& t : ts) s.submit(t);
  s.sync();
  for (auto& t : ts) EXPECT_TRUE(t->done());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[size_t(i)], i);
  EXPECT_EQ(team, 3);
  EXPECT_NE(get_num_threads(), 0);  // the caller's own setting is untouched
}

TEST(Stream, ErrorsRethrowOnEveryWaitAndLaterTasksRun) {
  Stream s(1, 0);
  auto bad = task([] { throw ValueError("bias is not finite"); });
  std::atomic<bool> ran{false};
  auto good = task([&] { ran = true; });
  s.submit(bad), s.submit(good);
  for (int i = 0; i < 2; ++i) {
    try {
      bad->wait(-1);
      FAIL() << "no exception";
    } catch (const ValueError& e) {
      EXPECT_STREQ(e.what(), "bias is not finite");
    }
  }
  EXPECT_TRUE(good->wait(-1));
  EXPECT_TRUE(ran);
}

TEST(Stream, WaitTimesOutAndTheTaskStillCompletes) {
  for (int64_t spin : {int64_t(0), int64_t(500000)}) {  // a waiter's polling counts against its timeout
    Stream s(1, spin);
    std::atomic<bool> go{false};
    auto t = gated_task(go);
    s.submit(t);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(t->wait(0.01));
    EXPECT_LT(seconds_since(t0), 0.25);
    EXPECT_FALSE(t->done());
    go = true;
    EXPECT_TRUE(t->wait(-1));
  }
}

TEST(Stream, WaitPollsPastTheLastRunThenSleepsAndKeepsItsTimeout) {
  // Where the team leaves a processor free, wait() polls for spin_us plus twice the last run, at most 0.1 s
  // (here 0.1 s): a timeout still bounds it, and a task that outlasts the poll wakes its sleeping waiter.
  Stream s(1, 100);
  auto first = task([] { std::this_thread::sleep_for(std::chrono::milliseconds(150)); });
  s.submit(first);
  ASSERT_TRUE(first->wait(-1));
  std::atomic<bool> go{false};
  auto t = gated_task(go);
  s.submit(t);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(t->wait(0.01));
  EXPECT_LT(seconds_since(t0), 0.09);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(450));  // past the poll: the waiter sleeps
    go = true;
  });
  EXPECT_TRUE(t->wait(-1));
  EXPECT_GE(seconds_since(t0), 0.45);
  release.join();
}

TEST(Stream, CloseRunsWhatIsQueuedAndRefusesMore) {
  std::atomic<int> n{0};
  std::vector<std::shared_ptr<StreamTask>> ts;
  {
    Stream s(1, 0);
    for (int i = 0; i < 20; ++i) ts.push_back(task([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      ++n;
    })), s.submit(ts.back());
    s.close();
    EXPECT_TRUE(s.closed());
    EXPECT_THROW(s.submit(task([] {})), ValueError);
    s.close();  // idempotent
  }
  EXPECT_EQ(n.load(), 20);
  {
    Stream s(1, 100);  // destroyed with work queued: the destructor runs it
    for (int i = 0; i < 5; ++i) s.submit(task([&] { ++n; }));
  }
  EXPECT_EQ(n.load(), 25);
  EXPECT_THROW(Stream(0, 0), ValueError);
  EXPECT_THROW(Stream(1, -1), ValueError);
}

TEST(Stream, ManySubmittersOneWorker) {
  Stream s(1, 20);
  std::atomic<int> n{0};
  std::vector<std::thread> th;
  std::vector<std::shared_ptr<StreamTask>> all[4];
  for (int j = 0; j < 4; ++j)
    th.emplace_back([&, j] {
      for (int i = 0; i < 200; ++i) {
        all[j].push_back(task([&] { n.fetch_add(1, std::memory_order_relaxed); }));
        s.submit(all[j].back());
        if (i % 50 == 0) all[j].back()->wait(-1);
      }
    });
  for (auto& t : th) t.join();
  s.sync();
  EXPECT_EQ(n.load(), 800);
  for (auto& v : all)
    for (auto& t : v) EXPECT_TRUE(t->done());
}

// Submit / wait hand-offs where both sides poll (the worker between tasks, the waiter for its task) and where
// both sleep: every result is the task's own, read after wait() without any other synchronisation.
TEST(Stream, PollingAndSleepingHandOffs) {
  for (int64_t spin : {int64_t(0), int64_t(2000)}) {
    Stream s(1, spin);
    for (int i = 0; i < 300; ++i) {
      int value = -1;
      auto t = task([&value, i] {
        if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
        value = i;
      });
      s.submit(t);
      ASSERT_TRUE(t->wait(-1));
      EXPECT_EQ(value, i);
      if (i % 100 == 99) std::this_thread::sleep_for(std::chrono::milliseconds(4));  // past the poll: asleep
    }
  }
}

}  // namespace
}  // namespace moe_cpu
