// w8a8_avx2.cpp — INT8 weights x per-row INT8 activations, AVX2: vpmaddubsw(|w|, sign(a, w)) then
// vpmaddwd, which cannot saturate int16 (|w| <= 128, |a| <= 127).
// Tile: 4 rows x 16 columns, K step 4. Packed weights: common/layout.h int8 panels (w + 128), or split 5- / 6-bit
// codes (int_avx2_split.h).
// Needs: AVX2, FMA. Limits: any M, N; group length <= 65536.
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx2.h"
#include "kernels/int_avx2_g32.h"
#include "kernels/int_avx2_split.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a8_avx2{"w8a8_avx2_4x16", Scheme::kInt8W8A8, "avx2", 4, 16, kFeatAvx2, kernels::int8_groups_fit<4>,
                                         kernels::int8_avx2_codes_gemm<4, 1, 1>,
                                         /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/true,
                                         /*gathers_rows=*/nullptr, /*half_scales=*/true, /*split_codes=*/true,
                                         /*qword_panels=*/false, /*split3=*/false, /*int_nibbles=*/true};

}  // namespace moe_cpu
