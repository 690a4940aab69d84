// threads.h — the thread count of every parallel loop in moe_cpu (default: OpenMP's max threads).
#pragma once
#include <cstdint>
#include <string>

namespace moe_cpu {

int max_num_threads();               // 1024, or the processor count when larger
void set_num_threads(int64_t n);     // n in [1, max_num_threads()], else ValueError
int get_num_threads();                 // the calling thread's own count if set, else the global one
void set_thread_num_threads(int n);    // the calling thread's count (0: the global setting); Stream workers
int num_procs();                       // the processors this process may run on

// The compute team (docs/threads.md): moe_cpu's own (common/thread_pool.h) unless MOE_CPU_TEAM=omp or OMP_PROC_BIND /
// OMP_PLACES is set (then OpenMP's, which binds). ValueError for a bad MOE_CPU_TEAM / MOE_CPU_SPIN_US.
bool pool_enabled();
int64_t pool_spin_us();                // microseconds an idle worker polls before it sleeps (MOE_CPU_SPIN_US)
constexpr int64_t kDefaultSpinUs = 200;
std::string compute_team();            // which team and how it waits, in words

}  // namespace moe_cpu
