// fp8w_avx512vbmi.cpp — FP8 e4m3fn weights (block scales) x BF16 activations, AVX512_BF16 with the
// e4m3 -> bf16 decode done by AVX512_VBMI byte tables: 64 codes (two k-steps) in 5 instructions
// (2 vpermt2b lookups, a sign vpternlogd, 2 vpermt2b interleaves) instead of 18. Otherwise as
// fp8w_avx512bf16, but on a 6 rows x 32 columns tile: each activation pair is broadcast once into a
// register for both panels (8x16 loaded it per vdpbf16ps, and those loads bound the tile: 12-17% at
// M = 1024 on Zen 5); each K-block's fp32 sum times the column's block scale. Decode takes two panels a
// tile: two vdpbf16ps chains (one waited on its latency: 12 GB/s a core), each summed as the row tiles do.
// Packed weights: common/layout.h fp8 panels.
// Needs: AVX512F, AVX512BW, AVX512_BF16, AVX512_VBMI. Limits: any M, N; block_k even (or one K-block).
#define MOE_ISA avx512vbmi  // kernels/isa.h: this file's ISA region
#include "kernels/float_avx512bf16.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_fp8w_avx512vbmi{
    "fp8w_avx512vbmi_6x32", Scheme::kFp8W8A16, "avx512vbmi", 6, 32, kFeatAvx512 | kFeatAvx512Bf16 | kFeatAvx512Vbmi,
    kernels::groups_aligned<2>, kernels::drive<kernels::FloatBf16<true, true>::Micro, 6, 2, 2>};

}  // namespace moe_cpu
