// bf16_neon_bf16.cpp — BF16 weights x BF16 activations, AArch64 BFDOT.
// Tile: 4 rows x 16 columns (16 float32x4 accumulators), K step 2 (one BFDOT per 16-byte panel quarter).
// Packed weights: common/layout.h bf16 panels. Numerics: BFDOT's fp32 sums of bf16 products.
// Needs: AdvSIMD + BF16. Limits: any M, N, K.
#define MOE_ISA neon_bf16  // kernels/isa.h: this file's ISA region
#include "kernels/float_neon.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_bf16_neon_bf16{
    "bf16_neon_bf16_4x16", Scheme::kBf16, "neon_bf16", 4, 16, kFeatNeon | kFeatNeonBf16, nullptr,
    kernels::drive<kernels::FloatNeon<false, true>::Micro, 4, 1, 2>};

}  // namespace moe_cpu
