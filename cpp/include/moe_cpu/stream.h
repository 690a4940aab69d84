// stream.h — an asynchronous worker for the CPU half of a hybrid server (issue 34): tasks submitted to a
// Stream run on its own thread (and its own team of num_threads compute threads), in submission order, while
// the caller goes on. Between tasks the worker spins for a bounded time, then sleeps on a condition variable.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace moe_cpu {

// One submitted task: its work, and what wait() reads once the worker has run it.
class StreamTask {
 public:
  explicit StreamTask(std::function<void()> work) : work_(std::move(work)) {}
  bool done() const;
  // Blocks until the task has run, or for at most timeout_s seconds (< 0: no limit): when the stream's team
  // leaves a processor free, polls (yielding between polls) for the stream's spin_us plus twice its last task's
  // run time (that part at most 0.1 s), then sleeps. Returns whether it ran; rethrows the task's exception
  // (every time it is waited on).
  bool wait(double timeout_s) const;

 private:
  friend class Stream;
  void run();
  std::function<void()> work_;
  std::exception_ptr err_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::atomic<bool> done_{false};
  int64_t spin_us_ = 0;  // how long wait() polls: set by Stream::submit
  mutable std::atomic<int> sleepers_{0};  // waiters asleep on cv_ (run() notifies only when there are some)
};

class Stream {
 public:
  // num_threads: the compute team of each task (ValueError outside [1, max_num_threads()]); spin_us: how
  // long the idle worker polls for the next task before it sleeps (0: sleep at once).
  Stream(int64_t num_threads, int64_t spin_us);
  ~Stream();  // close()
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues a task (ValueError after close()).
  void submit(std::shared_ptr<StreamTask> t);
  // Waits for every task submitted so far.
  void sync();
  // Runs what is queued, then ends the worker. Later submit() raises; done tasks stay readable.
  void close();
  bool closed() const;
  int64_t num_threads() const { return threads_; }
  int64_t spin_us() const { return spin_us_; }

 private:
  void loop();
  const int64_t threads_, spin_us_;
  const int64_t wait_spin_us_;  // spin_us_ where the team leaves a processor free (wait() may poll), else 0
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<StreamTask>> queue_;
  std::atomic<int64_t> last_run_us_{0};  // the last task's run time (how long wait() polls)
  std::atomic<uint64_t> queued_{0};  // tasks in queue_ (the spinning worker polls it without the lock)
  bool closing_ = false, sleeping_ = false;
  uint64_t submitted_ = 0, finished_ = 0;
  std::thread worker_;
};

}  // namespace moe_cpu
