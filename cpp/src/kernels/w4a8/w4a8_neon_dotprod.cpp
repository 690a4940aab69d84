// w4a8_neon_dotprod.cpp — INT4 weights x per-row INT8 activations, AArch64 SDOT.
// Tile: 4 rows x 16 columns (16 int32x4 accumulators), K step 8 (two SDOT per 16-byte panel quarter).
// Packed weights: common/layout.h int4 panels; zero points removed via the group activation sums; integer / fp16
// scales and mins widened per call (int_neon_forms.h).
// Needs: AdvSIMD + dotprod. Limits: any M, any N, K % group == 0.
#define MOE_ISA neon_dotprod  // kernels/isa.h: this file's ISA region
#include "kernels/int_neon_dotprod.h"
#include "kernels/int_neon_forms.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w4a8_neon_dotprod{
    "w4a8_neon_dotprod_4x16", Scheme::kInt4W4A8, "neon_dotprod", 4, 16, kFeatNeon | kFeatNeonDotprod, nullptr,
    kernels::int_neon_compact_gemm<true, kernels::IntNeonDot, 4, 1, 2>, /*f32_acts=*/false, /*int_mins=*/true,
    /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
