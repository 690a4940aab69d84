// threads.h — the thread count of every parallel loop in moe_cpu (default: OpenMP's max threads).
#pragma once
#include <cstdint>

namespace moe_cpu {

int max_num_threads();               // 1024, or the processor count when larger
void set_num_threads(int64_t n);     // n in [1, max_num_threads()], else ValueError
int get_num_threads();

}  // namespace moe_cpu
