// fp8w_avx2.cpp — FP8 e4m3fn weights (block scales) x BF16 activations, AVX2: codes decoded to bf16
// then fp32 in registers (exact), fp32 FMA, each K-block's sum times the column's block scale.
// Tile: 4 rows x 16 columns, K step 2. Packed weights: common/layout.h fp8 panels.
// Needs: AVX2, FMA. Limits: any M, N; block_k even (or one K-block).
#include "kernels/float_avx2.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_fp8w_avx2{"fp8w_avx2_4x16", Scheme::kFp8W8A16, "avx2", 4, 16, kFeatAvx2, kernels::groups_aligned<2>,
                                         kernels::drive<kernels::FloatAvx2<true>::Micro, 4, 1, 2>};

}  // namespace moe_cpu
