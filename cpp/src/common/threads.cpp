// threads.cpp — the thread-count setting read by parallel_for.
#include "moe_cpu/threads.h"

#include <algorithm>
#include <atomic>

#include "moe_cpu/errors.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace moe_cpu {

namespace {
int default_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
std::atomic<int> g_threads{0};
thread_local int t_threads = 0;  // a Stream worker's own team size
}  // namespace

void set_thread_num_threads(int n) { t_threads = n; }

int max_num_threads() {
#ifdef _OPENMP
  return std::max(1024, omp_get_num_procs());
#else
  return 1024;
#endif
}

void set_num_threads(int64_t n) {
  // More threads than that only slow a call down (16384 took seconds here), and past the OS's limits
  // the OpenMP runtime dies creating them.
  if (n < 1 || n > max_num_threads())
    throw ValueError(msg("num_threads = ", n, " must be in [1, ", max_num_threads(),
                         "] (1024, or this machine's processor count when larger)"));
  g_threads = int(n);
}
int get_num_threads() {
  if (t_threads > 0) return t_threads;
  int n = g_threads.load();
  return n > 0 ? n : default_threads();
}

int num_procs() { return omp_get_num_procs(); }

}  // namespace moe_cpu
