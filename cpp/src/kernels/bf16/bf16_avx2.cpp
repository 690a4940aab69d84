// bf16_avx2.cpp — BF16 weights x BF16 activations, AVX2: bf16 widened to fp32 by shifts, fp32 FMA.
// Tile: 4 rows x 16 columns (8 ymm accumulators), K step 2. Packed weights: common/layout.h bf16 panels.
// Needs: AVX2, FMA. Limits: any M, N, K.
#include "kernels/float_avx2.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_bf16_avx2{"bf16_avx2_4x16", Scheme::kBf16, "avx2", 4, 16, kFeatAvx2, nullptr,
                                         kernels::drive<kernels::FloatAvx2<false>::Micro, 4, 1, 2>};

}  // namespace moe_cpu
