// w8a16_neon.cpp — INT8 weights x per-row INT16 activations (int8_w8a16), AdvSIMD (SMLAL), every Arm tier.
// Tile: 1 row x 16 columns (kernels/int16_neon.h). Needs: AdvSIMD (Armv8.0). Limits: any M, any N, groups
// aligned to the k-step.
#define MOE_ISA neon  // kernels/isa.h: this file's ISA region
#include "kernels/int16_neon.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w8a16_neon{"w8a16_neon_1x16", Scheme::kInt8W8A16, "neon", 1, 16, kFeatNeon,
                                          kernels::groups_aligned<4>, kernels::drive<kernels::Int16Neon<false>::Micro, 1, 1, 1>};

}  // namespace moe_cpu
