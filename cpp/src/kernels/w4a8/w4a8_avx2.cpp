// w4a8_avx2.cpp — INT4 weights x per-row INT8 activations, AVX2 (vpmaddubsw + vpmaddwd, no VNNI).
// Tile: 4 rows x 16 columns (two ymm per row), K step 8 (two 32-byte halves of a panel row).
// Packed weights: common/layout.h int4 panels; zero points removed via the group activation sums.
// Scales and mins: fp32 per (column, group), or K-quant integers (d * int8 scales, dmin * int16 mins per
// run of 8 groups) turned into the same fp32 values per group.
// Needs: AVX2, FMA. Limits: any M, any N, K % group == 0.
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx2.h"
#include "kernels/int_avx2_g32.h"
#include "kernels/int_avx2_runs.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w4a8_avx2{"w4a8_avx2_4x16", Scheme::kInt4W4A8, "avx2", 4, 16, kFeatAvx2, nullptr,
                                         kernels::int4_avx2_gemm<kernels::IntDot::kMaddubs, 4, 1, 1>,
                                         /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
                                         /*gathers_rows=*/nullptr, /*half_scales=*/true, /*split_codes=*/false,
                                         /*qword_panels=*/true};

}  // namespace moe_cpu
