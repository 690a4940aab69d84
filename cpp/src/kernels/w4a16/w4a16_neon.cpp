// w4a16_neon.cpp — INT4 weights x per-row INT16 activations (int4_w4a16), AdvSIMD (SMLAL), every Arm tier.
// Tile: 1 row x 16 columns (kernels/int16_neon.h). Every int4 form: codebooks (TBL to signed values), zero
// points, float mins. Needs: AdvSIMD (Armv8.0). Limits: any M, any N, K % group == 0.
#define MOE_ISA neon  // kernels/isa.h: this file's ISA region
#include "kernels/int16_neon.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w4a16_neon{"w4a16_neon_1x16", Scheme::kInt4W4A16, "neon", 1, 16, kFeatNeon, nullptr,
                                          kernels::int4_a16_neon_gemm};

}  // namespace moe_cpu
