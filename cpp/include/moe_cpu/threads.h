// threads.h — the thread count of every parallel loop in moe_cpu (default: OpenMP's max threads).
#pragma once
#include <cstdint>

namespace moe_cpu {

int max_num_threads();               // 1024, or the processor count when larger
void set_num_threads(int64_t n);     // n in [1, max_num_threads()], else ValueError
int get_num_threads();                 // the calling thread's own count if set, else the global one
void set_thread_num_threads(int n);    // the calling thread's count (0: the global setting); Stream workers
int num_procs();                       // the processors this process may run on

}  // namespace moe_cpu
