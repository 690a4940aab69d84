// bf16_avx512bf16.cpp — BF16 weights x BF16 activations, AVX512_BF16.
// Tile: 4 rows x 64 columns (16 fp32 accumulators), K step 2 (one vdpbf16ps per 64-byte panel row).
// Packed weights: common/layout.h bf16 panels (16 columns x 2 k per row).
// Numerics: exact bf16 products, fp32 sums (vdpbf16ps flushes bf16 subnormals to zero).
// Needs: AVX512F, AVX512BW, AVX512_BF16. Limits: any M, N, K.
#define MOE_ISA avx512bf16  // kernels/isa.h: this file's ISA region
#include "kernels/float_avx512bf16.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_bf16_avx512bf16{
    "bf16_avx512bf16_4x64", Scheme::kBf16, "avx512bf16", 4, 64, kFeatAvx512 | kFeatAvx512Bf16,
    nullptr, kernels::drive<kernels::FloatBf16<false>::Micro, 4, 4, 1>};

}  // namespace moe_cpu
