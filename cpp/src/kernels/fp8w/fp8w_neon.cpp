// fp8w_neon.cpp — FP8 e4m3fn weights (block scales) x BF16 activations, plain AdvSIMD: codes decoded to
// fp32 in registers (exact), fp32 FMA, each K-block's sum times the column's block scale.
// Tile: 2 rows x 16 columns (block and running sums: 16 float32x4 registers), K step 2.
// Needs: AdvSIMD. Limits: any M, N; block_k even (or one K-block).
#define MOE_ISA neon  // kernels/isa.h: this file's ISA region
#include "kernels/float_neon.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_fp8w_neon{"fp8w_neon_2x16", Scheme::kFp8W8A16, "neon", 2, 16, kFeatNeon, kernels::groups_aligned<2>,
                                         kernels::drive<kernels::FloatNeon<true>::Micro, 2, 1, 2>};

}  // namespace moe_cpu
