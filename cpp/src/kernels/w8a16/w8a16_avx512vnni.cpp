// w8a16_avx512vnni.cpp — INT8 weights x per-row INT16 activations (int8_w8a16), AVX-512 VNNI (vpdpwssd).
// Tile: 4 rows x 32 columns, K step 4; decode one panel at a time. The w8a8 kernel's pipeline
// (kernels/int_avx512vnni.h) with the weight bytes w+128 split into even and odd bytes as int16 against
// int16 activation pairs; int32 sums per piece of at most kA16Piece channels.
// Needs: AVX512F, AVX512BW, AVX512VNNI. Limits: any M, any N, groups aligned to the k-step.
#define MOE_ISA avx512vnni  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx512vnni.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w8a16_avx512vnni{
    "w8a16_avx512vnni_4x32", Scheme::kInt8W8A16, "avx512vnni", 4, 32, kFeatAvx512 | kFeatAvx512Vnni,
    kernels::groups_aligned<4>, kernels::int_vnni_gemm_offset<false, false, 4, 2, 1, true>, /*f32_acts=*/false,
    /*int_mins=*/false, /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
