// bf16_avx2.cpp — BF16 weights x BF16 activations (read as fp32), AVX2: bf16 widened to fp32 by
// shifts, fp32 FMA. Up to 4 rows: 4x16 tiles widened in registers (decode: 1 row x 2 blocks); more
// rows: 6x16 tiles over an fp32 scratch widened once per panel chunk (float_avx2.h).
// Packed weights: common/layout.h bf16 panels. Needs: AVX2, FMA. Limits: any M, N, K.
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/float_avx2.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_bf16_avx2{"bf16_avx2_6x16", Scheme::kBf16, "avx2", 6, 16, kFeatAvx2, nullptr,
                                         kernels::FloatAvx2<false>::gemm, /*f32_acts=*/true};

}  // namespace moe_cpu
