// limits.h — shape limits shared by kernels (KernelDesc::supports): a kernel whose inner loop
// steps through K in chunks needs scale-group boundaries on chunk boundaries, and int8 kernels
// need each group's int32 sum (|u * a| <= 255 * 127 per product) to stay exact.
#pragma once
#include <cstdint>

#include "moe_cpu/packed_experts.h"

namespace moe_cpu::kernels {

// Groups start on multiples of `step` along K (or there is one group).
template <int64_t step>
bool groups_aligned(const PackedExperts& w) {
  return w.group_len() % step == 0 || w.num_groups() == 1;
}

// int8 kernels stepping `step` k at a time: aligned groups of at most 65536 (exact int32 sums).
template <int64_t step>
bool int8_groups_fit(const PackedExperts& w) {
  return w.group_len() <= 65536 && groups_aligned<step>(w);
}

}  // namespace moe_cpu::kernels
