// threads.cpp — the thread-count setting read by parallel_for.
#include "moe_cpu/threads.h"

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
}  // namespace

void set_num_threads(int n) {
  if (n < 1) throw ValueError(msg("num_threads = ", n, " must be >= 1"));
  g_threads = n;
}
int get_num_threads() {
  int n = g_threads.load();
  return n > 0 ? n : default_threads();
}

}  // namespace moe_cpu
