// w8a8_neon_i8mm.cpp — INT8 weights x per-row INT8 activations, AArch64 SMMLA (signed x signed).
// Tile: 4 rows x 16 columns, K step 8 (two panel rows zipped into each column pair's 8-k operand).
// Packed weights: common/layout.h int8 panels (w + 128, top bit flipped back), or split codes and integer / fp16
// scales and mins widened per call (int_neon_forms.h).
// Needs: AdvSIMD + i8mm. Limits: any M, N; group length a multiple of 8 (or one group), <= 65536.
#define MOE_ISA neon_i8mm  // kernels/isa.h: this file's ISA region
#include "kernels/int_neon_i8mm.h"
#include "kernels/int_neon_forms.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a8_neon_i8mm{
    "w8a8_neon_i8mm_4x16", Scheme::kInt8W8A8, "neon_i8mm", 4, 16, kFeatNeon | kFeatNeonI8mm, kernels::int8_groups_fit<8>,
    kernels::int_neon_compact_gemm<false, kernels::IntNeonMmla, 4, 1, 2>, /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
    /*gathers_rows=*/nullptr, /*half_scales=*/true, /*split_codes=*/true, /*qword_panels=*/false, /*split3=*/true,
    /*int_nibbles=*/true};

}  // namespace moe_cpu
