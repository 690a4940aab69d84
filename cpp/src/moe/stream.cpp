// stream.cpp — the Stream worker: a FIFO of tasks, run one at a time on the worker thread with its own
// compute team; the idle worker polls for spin_us, then sleeps until submit() or close() wakes it.
#include "moe_cpu/stream.h"

#include <algorithm>
#include <chrono>

#include "moe_cpu/errors.h"
#include "moe_cpu/threads.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moe_cpu {
namespace {
using Clock = std::chrono::steady_clock;
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
// Polls ready() until it holds or `until` passes, yielding the core between polls (so a thread that wants this
// core runs at once); returns ready().
template <class F>
bool poll_until(F ready, Clock::time_point until) {
  while (!ready() && Clock::now() < until) {
    for (int i = 0; i < 16; ++i) cpu_relax();
    std::this_thread::yield();
  }
  return ready();
}
}  // namespace

void StreamTask::run() {
  try {
    work_();
  } catch (...) {
    err_ = std::current_exception();
  }
  work_ = nullptr;  // what the work held goes now, on the worker
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.store(true, std::memory_order_release);
    if (sleepers_.load(std::memory_order_relaxed) == 0) return;
  }
  cv_.notify_all();  // outside the lock: a waiter woken here does not block on mu_ again
}

bool StreamTask::done() const { return done_.load(std::memory_order_acquire); }

bool StreamTask::wait(double timeout_s) const {
  const auto start = Clock::now();
  const auto after = [&](double s) { return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  if (!done_.load(std::memory_order_acquire) && spin_us_ > 0 && timeout_s != 0) {  // the task is often nearly done
    const auto until = after(timeout_s < 0 ? 1e-6 * double(spin_us_) : std::min(timeout_s, 1e-6 * double(spin_us_)));
    // Yields between polls: should the scheduler put this waiter beside a compute thread after all, the thread
    // runs. (Polling with pause alone: int4 decode 1.01-1.15x the blocking call in three runs, against 0.98-1.00.)
    poll_until([this] { return done_.load(std::memory_order_acquire); }, until);
  }
  if (!done_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_relaxed);
    const auto pred = [&] { return done_.load(std::memory_order_acquire); };
    bool ran = true;
    if (timeout_s < 0) cv_.wait(lock, pred);
    else ran = cv_.wait_until(lock, after(timeout_s), pred);  // the polling counts against the timeout
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    if (!ran) return false;
  }
  if (err_) std::rethrow_exception(err_);
  return true;
}

// A waiter polls only beside a team that leaves it a processor: where the team has every processor, its polls
// would take turns with the compute threads (measured: decode calls up to 1.5x slower). The processor count is
// read once (a system call).
Stream::Stream(int64_t num_threads, int64_t spin_us)
    : threads_(num_threads), spin_us_(spin_us), wait_spin_us_(num_threads < num_procs() ? spin_us : 0) {
  if (num_threads < 1 || num_threads > max_num_threads())
    throw ValueError(msg("num_threads = ", num_threads, " must be in [1, ", max_num_threads(), "]"));
  if (spin_us < 0 || spin_us > 1000000)
    throw ValueError(msg("spin_us = ", spin_us, " must be in [0, 1000000] (microseconds)"));
  worker_ = std::thread([this] { loop(); });
}

Stream::~Stream() { close(); }

void Stream::submit(std::shared_ptr<StreamTask> t) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) throw ValueError("this Stream is closed: submit to an open one");
    // Polls past the task's likely run (twice the last one, at most 0.1 s): a wake-up from sleep cost the caller
    // 20-100 us on the VM of docs/hybrid.md (int8 decode, 1.5 ms: 1.02-1.07x the blocking call with a 1 ms poll).
    const int64_t run_us = last_run_us_.load(std::memory_order_relaxed);
    t->spin_us_ = wait_spin_us_ ? wait_spin_us_ + std::min<int64_t>(2 * run_us, 100000) : 0;
    queue_.push_back(std::move(t));
    queued_.fetch_add(1, std::memory_order_release);
    ++submitted_;
    wake = sleeping_;
  }
  if (wake) cv_.notify_one();  // outside the lock (the worker re-checks the queue under it)
}

void Stream::sync() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = submitted_;
  idle_cv_.wait(lock, [&] { return finished_ >= target; });
}

void Stream::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ && !worker_.joinable()) return;
    closing_ = true;
    queued_.fetch_add(1, std::memory_order_release);  // ends a spinning worker's poll
    cv_.notify_one();
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

bool Stream::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closing_;
}

void Stream::loop() {
  set_thread_num_threads(int(threads_));
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty() && !closing_ && spin_us_ > 0) {  // poll a while: the next decode step comes soon
      const auto until = Clock::now() + std::chrono::microseconds(spin_us_);
      lock.unlock();
      // Polls an atomic (submit never waits for the lock); a caller that wakes on this core (a host with fewer
      // cores than threads) runs at once.
      poll_until([this] { return queued_.load(std::memory_order_acquire) != 0; }, until);
      lock.lock();
    }
    sleeping_ = true;
    cv_.wait(lock, [&] { return !queue_.empty() || closing_; });
    sleeping_ = false;
    if (queue_.empty()) return;  // closing, nothing left
    std::shared_ptr<StreamTask> t = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    const auto t0 = Clock::now();
    t->run();
    last_run_us_.store(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count(),
                       std::memory_order_relaxed);
    t.reset();
    lock.lock();
    ++finished_;
    idle_cv_.notify_all();
  }
}

}  // namespace moe_cpu
