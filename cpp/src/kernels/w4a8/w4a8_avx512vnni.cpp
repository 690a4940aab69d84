// w4a8_avx512vnni.cpp — INT4 weights x per-row INT8 activations, AVX-512 VNNI.
// Tile: 6 rows x 32 columns (12 zmm accumulators + 12 fp32 group sums, all in registers), K step 8 (two vpdpbusd per 64-byte panel row);
// decode (one row) streams one 16-column panel at a time with software prefetch.
// Packed weights: common/layout.h int4 panels (nibble u = q+8, raw with zero points, or a codebook
// index: one vpshufb per 64 codes); optional group offsets (mins) cost one FMA per group, or as
// integer mins (K-quants) one vpdpwssd per two groups and one FMA per run of 8.
// Scales: fp32 per (column, group), or as integer scales (K-quants, IQ4_XS) an int8 per (column, group)
// times an fp32 per run of 8 groups.
// Needs: AVX512F, AVX512BW, AVX512VNNI. Limits: any M, any N (tail masked), K % group == 0, groups a multiple of
// 32 (or per channel): groups of 16 (GGUF IQ2_XS, IQ2_S, IQ1_M) take the AVX2 kernel until checked on an AVX-512 host.
#define MOE_ISA avx512vnni  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx512vnni.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w4a8_avx512vnni{
    "w4a8_avx512vnni_6x32", Scheme::kInt4W4A8, "avx512vnni", 6, 32, kFeatAvx512 | kFeatAvx512Vnni,
    kernels::groups_aligned<32>, kernels::int4_vnni_gemm<6, 2, 1>, /*f32_acts=*/false, /*int_mins=*/true,
    /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
