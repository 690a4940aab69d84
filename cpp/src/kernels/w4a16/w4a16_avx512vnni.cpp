// w4a16_avx512vnni.cpp — INT4 weights x per-row INT16 activations (int4_w4a16), AVX-512 VNNI (vpdpwssd).
// Tile: 4 rows x 32 columns (two zmm per row), K step 8; decode one panel at a time. The w4a8 kernel's
// pipeline (kernels/int_avx512vnni.h) with each unsigned weight byte vector split into its even and odd
// bytes as int16 against int16 activation pairs; int32 sums per piece of at most kA16Piece channels.
// Every int4 form: codebooks, zero points, float mins, integer scales (integer mins: their float form).
// Needs: AVX512F, AVX512BW, AVX512VNNI. Limits: any M, any N, K % group == 0.
#define MOE_ISA avx512vnni  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx512vnni.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w4a16_avx512vnni{
    "w4a16_avx512vnni_4x32", Scheme::kInt4W4A16, "avx512vnni", 4, 32, kFeatAvx512 | kFeatAvx512Vnni,
    nullptr, kernels::int4_vnni_gemm<4, 2, 1, true>, /*f32_acts=*/false, /*int_mins=*/false,
    /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
