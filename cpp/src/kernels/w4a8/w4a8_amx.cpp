// w4a8_amx.cpp — INT4 weights x per-row INT8 activations, AMX-INT8 (tdpbsud), for experts with at least
// amx_min_rows() rows; fewer go to w4a8_avx512vnni, whose result is bitwise the same (int_amx.h).
// Every int4 form: groups or per channel, zero points, codebooks, float or integer mins, integer
// scales, act-order (the gathered activations).
// Tile: 32 rows x 32 columns (4 C tiles), K step 64 (32 with groups of 32).
// Packed weights: common/layout.h int4 panels, widened to one byte per code (through code_table) in a
// scratch per column pair and call.
// Needs: kFeatAmxKernels (AMX-TILE, INT8, BF16 with the tile state granted; AVX-512 VNNI, BF16, VBMI).
// Limits: groups a multiple of 32 (or per channel).
#define MOE_ISA amx  // kernels/isa.h: this file's ISA region
#include "kernels/int_amx.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w4a8_avx512vnni;

extern const KernelDesc kernel_w4a8_amx{
    "w4a8_amx_32x32", Scheme::kInt4W4A8, "amx", 32, 32, kFeatAmxKernels,
    kernels::groups_aligned<32>,
    kernels::amx_or_twin<&kernel_w4a8_avx512vnni, kernels::int_amx_gemm<kernels::AmxTiles, true>>,
    /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/true,
    /*gathers_rows=*/kernels::amx_takes_tiles};

}  // namespace moe_cpu
