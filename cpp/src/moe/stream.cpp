// stream.cpp — the Stream worker: a FIFO of tasks, run one at a time on the worker thread with its own
// compute team; the idle worker polls for spin_us, then sleeps until submit() or close() wakes it.
#include "moe_cpu/stream.h"

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
}  // namespace

void StreamTask::run() {
  try {
    work_();
  } catch (...) {
    err_ = std::current_exception();
  }
  work_ = nullptr;  // what the work held goes now, on the worker
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

bool StreamTask::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool StreamTask::wait(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_s < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done_; })) {
    return false;
  }
  if (err_) std::rethrow_exception(err_);
  return true;
}

Stream::Stream(int64_t num_threads, int64_t spin_us) : threads_(num_threads), spin_us_(spin_us) {
  if (num_threads < 1 || num_threads > max_num_threads())
    throw ValueError(msg("num_threads = ", num_threads, " must be in [1, ", max_num_threads(), "]"));
  if (spin_us < 0 || spin_us > 1000000)
    throw ValueError(msg("spin_us = ", spin_us, " must be in [0, 1000000] (microseconds)"));
  worker_ = std::thread([this] { loop(); });
}

Stream::~Stream() { close(); }

void Stream::submit(std::shared_ptr<StreamTask> t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) throw ValueError("this Stream is closed: submit to an open one");
  queue_.push_back(std::move(t));
  ++submitted_;
  if (sleeping_) cv_.notify_one();
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
      for (;;) {
        for (int i = 0; i < 64; ++i) cpu_relax();
        lock.lock();
        if (!queue_.empty() || closing_ || Clock::now() >= until) break;
        lock.unlock();
      }
    }
    sleeping_ = true;
    cv_.wait(lock, [&] { return !queue_.empty() || closing_; });
    sleeping_ = false;
    if (queue_.empty()) return;  // closing, nothing left
    std::shared_ptr<StreamTask> t = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    t->run();
    t.reset();
    lock.lock();
    ++finished_;
    idle_cv_.notify_all();
  }
}

}  // namespace moe_cpu
