// fp8w_avx2.cpp — FP8 e4m3fn weights (block scales) x BF16 activations (read as fp32), AVX2: codes
// widened exactly through fp16 (vpshufb, shift, and, vcvtph2ps), fp32 FMA, each K-block's sum times
// 256 x the column's block scale. Up to 4 rows: widened in registers; more: 6x16 tiles over an fp32
// scratch widened once per panel chunk (float_avx2.h). Packed weights: common/layout.h fp8 panels.
// Needs: AVX2, FMA. Limits: any M, N; block_k even (or one K-block).
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/float_avx2.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_fp8w_avx2{"fp8w_avx2_6x16", Scheme::kFp8W8A16, "avx2", 6, 16, kFeatAvx2, kernels::groups_aligned<2>,
                                         kernels::FloatAvx2<true>::gemm, /*f32_acts=*/true};

}  // namespace moe_cpu
