// w4a8_neon_i8mm.cpp — INT4 weights x per-row INT8 activations, AArch64 SMMLA.
// Tile: 4 rows x 16 columns (2 row pairs x 8 column pairs of 2x2 int32 tiles), K step 8 (the low and
// high nibbles of one panel row). Packed weights: common/layout.h int4 panels; integer / fp16 scales and mins
// widened per call (int_neon_forms.h).
// Needs: AdvSIMD + i8mm. Limits: any M, any N, K % group == 0.
#define MOE_ISA neon_i8mm  // kernels/isa.h: this file's ISA region
#include "kernels/int_neon_i8mm.h"
#include "kernels/int_neon_forms.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w4a8_neon_i8mm{
    "w4a8_neon_i8mm_4x16", Scheme::kInt4W4A8, "neon_i8mm", 4, 16, kFeatNeon | kFeatNeonI8mm, nullptr,
    kernels::int_neon_compact_gemm<true, kernels::IntNeonMmla, 4, 1, 2>, /*f32_acts=*/false, /*int_mins=*/true,
    /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
