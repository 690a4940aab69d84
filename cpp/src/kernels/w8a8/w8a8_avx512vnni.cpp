// w8a8_avx512vnni.cpp — INT8 weights x per-row INT8 activations, AVX-512 VNNI.
// Tile: 6 rows x 64 columns (24 zmm accumulators, 4 weight registers), K step 4 (one vpdpbusd per 64-byte panel row).
// Packed weights: common/layout.h int8 panels, stored as w + 128 (unsigned operand of vpdpbusd), or split 2- to 6-bit
// codes (int_avx512vnni_split.h).
// Scales: fp32 per (column, group) or per channel; mins as in w4a8_avx512vnni.cpp; GGUF Q2_K's 4-bit scales and
// mins (PackedExperts::int_nibbles).
// Needs: AVX512F, AVX512BW, AVX512VNNI. Limits: any M, any N; group length <= 65536 (int32 sums).
#define MOE_ISA avx512vnni  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx512vnni.h"
#include "kernels/int_avx512vnni_split.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a8_avx512vnni{
    "w8a8_avx512vnni_6x64", Scheme::kInt8W8A8, "avx512vnni", 6, 64, kFeatAvx512 | kFeatAvx512Vnni,
    kernels::int8_groups_fit<4>, kernels::int8_vnni_codes_gemm<6, 4, 1>, /*f32_acts=*/false, /*int_mins=*/true,
    /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true, /*split_codes=*/true,
    /*qword_panels=*/false, /*split3=*/true, /*int_nibbles=*/true};

}  // namespace moe_cpu
