// threads.h — the thread count of every parallel loop in moe_cpu (default: OpenMP's max threads).
#pragma once

namespace moe_cpu {

void set_num_threads(int n);  // n >= 1, else ValueError
int get_num_threads();

}  // namespace moe_cpu
