// thread_pool.cpp — the compute team of thread_pool.h.
// A call publishes (n, fn, ctx) in one of two slots and a new epoch in `word_` (epoch << 40 | tasks claimed).
// Everyone claims task i by a CAS of word_ from (epoch, i) to (epoch, i + 1): a worker that read an old epoch
// fails its CAS and claims nothing, so it never runs a task of a call that has moved on. The caller returns
// once done[slot] == n, so fn and ctx outlive every claimed task. A slot is reused two calls later, when no
// CAS on its epoch can succeed any more.
#include "common/thread_pool.h"

#include "moe_cpu/errors.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOE_CPU_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MOE_CPU_PAUSE() asm volatile("yield")
#else
#define MOE_CPU_PAUSE() ((void)0)
#endif

namespace moe_cpu {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kCallerSpinUs = 50;  // the caller's poll for other threads' last tasks before it sleeps
constexpr int64_t kPauseUs = 20;       // an idle worker's poll with pause, before it polls with sched_yield
constexpr int kIdxBits = 40;
constexpr uint64_t kIdxMask = (uint64_t(1) << kIdxBits) - 1, kEpochMask = (uint64_t(1) << (64 - kIdxBits)) - 1;

int64_t env_spin_us() {
  const char* s = std::getenv("MOE_CPU_SPIN_US");
  if (!s || !*s) return kDefaultSpinUs;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (!end || *end != 0 || v < 0 || v > 1000000)
    throw ValueError(msg("MOE_CPU_SPIN_US = '", s, "' must be an integer in [0, 1000000] (microseconds)"));
  return int64_t(v);
}

// The CPU the calling thread runs on, or -1.
int current_cpu() {
#ifdef __linux__
  return sched_getcpu();
#else
  return -1;
#endif
}

bool env_pool() {
  const char* team = std::getenv("MOE_CPU_TEAM");
  if (team && *team && std::strcmp(team, "omp") != 0 && std::strcmp(team, "moe_cpu") != 0)
    throw ValueError(msg("MOE_CPU_TEAM = '", team, "' must be 'moe_cpu' (the default) or 'omp'"));
  if (team && std::strcmp(team, "omp") == 0) return false;
  return !std::getenv("OMP_PROC_BIND") && !std::getenv("OMP_PLACES");
}

std::atomic<uint64_t> g_fork_gen{0};  // pools made before a fork() have no workers in the child
thread_local bool t_in_task = false;

class Pool {
 public:
  explicit Pool(int workers) : spin_us_(pool_spin_us()), fork_gen_(g_fork_gen.load()) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int workers() const { return int(threads_.size()); }
  bool stale() const { return fork_gen_ != g_fork_gen.load(); }

  void run(int64_t n, void (*fn)(void*, int64_t), void* ctx) {
    const uint64_t epoch = ((word_.load(std::memory_order_relaxed) >> kIdxBits) + 1) & kEpochMask;
    Slot& s = slots_[epoch & 1];
    s.n.store(n, std::memory_order_relaxed), s.fn.store(fn, std::memory_order_relaxed);
    s.ctx.store(ctx, std::memory_order_relaxed), s.done.store(0, std::memory_order_relaxed);
    word_.store(epoch << kIdxBits, std::memory_order_seq_cst);  // publishes the slot
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      caller_cpu_.store(current_cpu(), std::memory_order_relaxed);
      { std::lock_guard<std::mutex> lock(mu_); }
      cv_.notify_all();
      sched_yield();  // a worker woken onto this CPU runs now, and moves (leave_cpu)
    }
    work(epoch);
    // The tasks still running are other threads' (one may have been descheduled): poll a while, then sleep, so
    // that this CPU can run the descheduled thread instead of a spinning caller.
    const auto until = Clock::now() + std::chrono::microseconds(kCallerSpinUs);
    for (int i = 0; s.done.load(std::memory_order_acquire) != n; ++i) {
      MOE_CPU_PAUSE();
      if ((i & 63) == 63 && Clock::now() >= until) {
        std::unique_lock<std::mutex> lock(mu_);
        caller_waits_.store(true, std::memory_order_seq_cst);
        done_cv_.wait(lock, [&] { return s.done.load(std::memory_order_seq_cst) == n; });
        caller_waits_.store(false, std::memory_order_relaxed);
        break;
      }
    }
  }

 private:
  // A late worker may read a slot while its next call overwrites it (its claim then fails): atomics, relaxed.
  struct Slot {
    std::atomic<int64_t> n{0};
    std::atomic<void (*)(void*, int64_t)> fn{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<int64_t> done{0};
  };

  // Claims and runs tasks of `epoch` until none is left (or the word has moved on to another call).
  void work(uint64_t epoch) {
    Slot& s = slots_[epoch & 1];
    const int64_t n = s.n.load(std::memory_order_relaxed);
    void (*fn)(void*, int64_t) = s.fn.load(std::memory_order_relaxed);
    void* ctx = s.ctx.load(std::memory_order_relaxed);
    uint64_t w = word_.load(std::memory_order_acquire);
    for (;;) {
      if ((w >> kIdxBits) != epoch || int64_t(w & kIdxMask) >= n) return;
      if (!word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      t_in_task = true;
      fn(ctx, int64_t(w & kIdxMask));
      t_in_task = false;
      if (s.done.fetch_add(1, std::memory_order_seq_cst) + 1 == n && caller_waits_.load(std::memory_order_seq_cst)) {
        { std::lock_guard<std::mutex> lock(mu_); }
        done_cv_.notify_all();
      }
      w = word_.load(std::memory_order_acquire);
    }
  }

  void loop() {
    uint64_t seen = word_.load(std::memory_order_acquire) >> kIdxBits;
    for (;;) {
      uint64_t epoch = word_.load(std::memory_order_acquire) >> kIdxBits;
      if (epoch == seen && !stop_.load(std::memory_order_relaxed)) {  // poll, then sleep
        const auto until = Clock::now() + std::chrono::microseconds(spin_us_);
        const auto pause_until = Clock::now() + std::chrono::microseconds(std::min<int64_t>(spin_us_, kPauseUs));
        bool pausing = true;
        for (int i = 0; (epoch = word_.load(std::memory_order_acquire) >> kIdxBits) == seen; ++i) {
          if (stop_.load(std::memory_order_relaxed)) return;
          if (pausing) MOE_CPU_PAUSE();
          else sched_yield();  // past kPauseUs: poll without keeping the CPU from a thread that wants it
          if ((i & 63) == 63 || !pausing) {
            const auto now = Clock::now();
            if (now >= until) break;
            pausing = now < pause_until;
          }
        }
        if (epoch == seen) {
          std::unique_lock<std::mutex> lock(mu_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          cv_.wait(lock, [&] {
            return stop_.load() || (word_.load(std::memory_order_seq_cst) >> kIdxBits) != seen;
          });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          lock.unlock();
          leave_cpu(caller_cpu_.load(std::memory_order_relaxed));
          epoch = word_.load(std::memory_order_acquire) >> kIdxBits;
        }
      }
      if (stop_.load()) return;
      seen = epoch;
      work(epoch);
    }
  }

  const int64_t spin_us_;
  const uint64_t fork_gen_;
  std::atomic<uint64_t> word_{0};
  Slot slots_[2];
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::atomic<bool> caller_waits_{false};
  std::atomic<int> caller_cpu_{-1};  // the CPU of the last call that woke sleeping workers
  std::vector<std::thread> threads_;
};

struct ForkHook {
  ForkHook() { pthread_atfork(nullptr, nullptr, [] { g_fork_gen.fetch_add(1); }); }
};

// The calling thread's team, made (or remade) for `workers` workers.
Pool& team_of(int workers) {
  static ForkHook hook;
  thread_local std::unique_ptr<Pool> pool;
  if (pool && pool->stale()) (void)pool.release();  // a fork() child: none of its threads exist here (leaked)
  if (!pool || pool->workers() != workers) {
    pool.reset();
    pool = std::make_unique<Pool>(workers);
  }
  return *pool;
}

}  // namespace

// A worker woken from sleep may land on the CPU of the caller that woke it (the scheduler's wake-affine
// placement) and wait there behind the busy caller for milliseconds while another CPU idles: the caller then does
// every task alone (decode after a 20 ms pause ran 0.67 ms a call instead of 0.50 on a 2-CPU VM, call after call;
// `perf sched timehist`: the worker's scheduling delay 2-4 ms). Such a worker moves itself: its allowed CPUs
// without that one, then all of them again.
void leave_cpu(int cpu) {
#ifdef __linux__
  if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getcpu() != cpu) return;
  cpu_set_t all, other;
  if (sched_getaffinity(0, sizeof all, &all) != 0 || !CPU_ISSET(cpu, &all) || CPU_COUNT(&all) < 2) return;
  other = all;
  CPU_CLR(cpu, &other);
  if (sched_setaffinity(0, sizeof other, &other) == 0) sched_setaffinity(0, sizeof all, &all);
#else
  (void)cpu;
#endif
}

bool pool_enabled() {
  static const bool on = env_pool();
  return on;
}

int64_t pool_spin_us() {
  static const int64_t us = env_spin_us();
  return us;
}

std::string compute_team() {
  if (pool_enabled()) return msg("moe_cpu (idle workers poll ", pool_spin_us(), " us, then sleep)");
  const char* team = std::getenv("MOE_CPU_TEAM");
  return team && std::strcmp(team, "omp") == 0 ? "openmp (MOE_CPU_TEAM=omp)"
                                               : "openmp (OMP_PROC_BIND / OMP_PLACES set: OpenMP binds the threads)";
}

void pool_run(int64_t n, int threads, void (*fn)(void*, int64_t), void* ctx) {
  if (n <= 0) return;
  if (threads <= 1 || n == 1 || t_in_task) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  team_of(threads - 1).run(n, fn, ctx);
}

}  // namespace moe_cpu
