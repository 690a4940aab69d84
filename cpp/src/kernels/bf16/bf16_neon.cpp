// bf16_neon.cpp — BF16 weights x BF16 activations, plain AdvSIMD: bf16 widened to fp32 by shifts, fp32 FMA.
// Tile: 4 rows x 16 columns (16 float32x4 accumulators), K step 2. Packed weights: common/layout.h bf16 panels.
// Needs: AdvSIMD (every AArch64 CPU). Limits: any M, N, K.
#define MOE_ISA neon  // kernels/isa.h: this file's ISA region
#include "kernels/float_neon.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_bf16_neon{"bf16_neon_4x16", Scheme::kBf16, "neon", 4, 16, kFeatNeon, nullptr,
                                         kernels::drive<kernels::FloatNeon<false>::Micro, 4, 1, 2>};

}  // namespace moe_cpu
