// w4a16_avx2.cpp — INT4 weights x per-row INT16 activations (int4_w4a16), AVX2 (vpmaddwd + vpaddd).
// Tile: 4 rows x 16 columns (two ymm per row), K step 8. kernels/int_avx2.h's IntDot::kMaddwd16: the
// unsigned weight bytes (through code_table with a codebook) split into even and odd int16 words against
// int16 activation pairs; int32 sums per piece of at most kA16Piece channels, the zero point removed with
// the piece's code sum. Every int4 form: codebooks, zero points, float mins, integer scales.
// Needs: AVX2, FMA. Limits: any M, any N, K % group == 0.
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx2.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w4a16_avx2{"w4a16_avx2_4x16", Scheme::kInt4W4A16, "avx2", 4, 16, kFeatAvx2, nullptr,
                                          kernels::int4_avx2_gemm<kernels::IntDot::kMaddwd16, 4, 1, 1>,
                                          /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/true,
                                          /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
