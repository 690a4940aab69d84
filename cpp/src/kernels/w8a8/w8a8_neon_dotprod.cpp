// w8a8_neon_dotprod.cpp — INT8 weights x per-row INT8 activations, AArch64 SDOT (signed x signed:
// the stored w + 128 has its top bit flipped back to w).
// Tile: 4 rows x 16 columns, K step 4. Packed weights: common/layout.h int8 panels, or split codes and integer /
// fp16 scales and mins widened per call (int_neon_forms.h).
// Needs: AdvSIMD + dotprod. Limits: any M, N; group length <= 65536.
#define MOE_ISA neon_dotprod  // kernels/isa.h: this file's ISA region
#include "kernels/int_neon_dotprod.h"
#include "kernels/int_neon_forms.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a8_neon_dotprod{
    "w8a8_neon_dotprod_4x16", Scheme::kInt8W8A8, "neon_dotprod", 4, 16, kFeatNeon | kFeatNeonDotprod, kernels::int8_groups_fit<4>,
    kernels::int_neon_compact_gemm<false, kernels::IntNeonDot, 4, 1, 2>, /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
    /*gathers_rows=*/nullptr, /*half_scales=*/true, /*split_codes=*/true, /*qword_panels=*/false, /*split3=*/true,
    /*int_nibbles=*/true};

}  // namespace moe_cpu
