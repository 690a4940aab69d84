// fp8w_neon_bf16.cpp — FP8 e4m3fn weights (block scales) x BF16 activations, AArch64 BFDOT: 8 codes are
// widened and decoded to bf16 in registers (exact), one BFDOT per row, K-block sums times the block scale.
// Tile: 4 rows x 16 columns. Packed weights: common/layout.h fp8 panels.
// Needs: AdvSIMD + BF16. Limits: any M, N; block_k even (or one K-block).
#define MOE_ISA neon_bf16  // kernels/isa.h: this file's ISA region
#include "kernels/float_neon.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_fp8w_neon_bf16{
    "fp8w_neon_bf16_4x16", Scheme::kFp8W8A16, "neon_bf16", 4, 16, kFeatNeon | kFeatNeonBf16, kernels::groups_aligned<2>,
    kernels::drive<kernels::FloatNeon<true, true>::Micro, 4, 1, 2>};

}  // namespace moe_cpu
