// fp8w_avx512bf16.cpp — FP8 e4m3fn weights (block scales) x BF16 activations, AVX512_BF16.
// Tile: 8 rows x 16 columns (decoding is shared by 8 rows), K step 2: 32 codes per panel row are widened and decoded to bf16
// in registers (exact), then one vdpbf16ps per row; each K-block's fp32 sum is multiplied by the
// column's block scale; decode takes two panels a tile (two chains). Packed weights: common/layout.h fp8
// panels; scales per (column, K-block).
// Needs: AVX512F, AVX512BW, AVX512_BF16. Limits: any M, N; block_k even (or one K-block).
#define MOE_ISA avx512bf16  // kernels/isa.h: this file's ISA region
#include "kernels/float_avx512bf16.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_fp8w_avx512bf16{
    "fp8w_avx512bf16_8x16", Scheme::kFp8W8A16, "avx512bf16", 8, 16, kFeatAvx512 | kFeatAvx512Bf16,
    kernels::groups_aligned<2>, kernels::drive<kernels::FloatBf16<true>::Micro, 8, 1, 2>};

}  // namespace moe_cpu
