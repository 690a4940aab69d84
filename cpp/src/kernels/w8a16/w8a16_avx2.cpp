// w8a16_avx2.cpp — INT8 weights x per-row INT16 activations (int8_w8a16), AVX2 (vpmaddwd + vpaddd).
// Tile: 4 rows x 16 columns, K step 4. kernels/int_avx2.h's IntDot::kMaddwd16 on the stored bytes w + 128
// (zero point 128 removed with each piece's code sum).
// Needs: AVX2, FMA. Limits: any M, any N, groups aligned to the k-step.
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/int_avx2.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a16_avx2{"w8a16_avx2_4x16", Scheme::kInt8W8A16, "avx2", 4, 16, kFeatAvx2,
                                          kernels::groups_aligned<4>,
                                          kernels::int8_avx2_gemm<kernels::IntDot::kMaddwd16, 4, 1, 1>,
                                          /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/true,
                                          /*gathers_rows=*/nullptr, /*half_scales=*/true};

}  // namespace moe_cpu
