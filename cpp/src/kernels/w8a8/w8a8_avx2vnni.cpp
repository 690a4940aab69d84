// w8a8_avx2vnni.cpp — INT8 weights x per-row INT8 activations, AVX2 + AVX-VNNI ({vex} vpdpbusd ymm
// on the stored bytes w + 128; 128 * the group's activation sum is subtracted after the group).
// Tile: 4 rows x 16 columns, K step 4. Packed weights: common/layout.h int8 panels.
// Needs: AVX2, FMA, AVX-VNNI. Limits: any M, N; group length <= 65536.
#define MOE_ISA avx2vnni  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx2.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w8a8_avx2vnni{
    "w8a8_avx2vnni_4x16", Scheme::kInt8W8A8, "avx2vnni", 4, 16, kFeatAvx2 | kFeatAvxVnni, kernels::int8_groups_fit<4>,
    kernels::int8_avx2_gemm<kernels::IntDot::kVnniVex, 4, 1, 1>, /*f32_acts=*/false, /*int_mins=*/false,
    /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
