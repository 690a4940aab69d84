// w8a8_amx.cpp — INT8 weights x per-row INT8 activations, AMX-INT8 (tdpbsud), for experts with at least
// amx_min_rows() rows; fewer go to w8a8_avx512vnni, whose result is bitwise the same (int_amx.h).
// Tile: 32 rows x 32 columns (4 C tiles), K step 64 (32 with groups of 32).
// Packed weights: common/layout.h int8 panels (u = w + 128), read in place as B tiles.
// Needs: kFeatAmxKernels (AMX-TILE, INT8, BF16 with the tile state granted; AVX-512 VNNI, BF16, VBMI).
// Limits: groups a multiple of 32 (or per channel) and at most 65536 long.
#define MOE_ISA amx  // kernels/isa.h: this file's ISA region
#include "kernels/int_amx.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a8_avx512vnni;

extern const KernelDesc kernel_w8a8_amx{
    "w8a8_amx_32x32", Scheme::kInt8W8A8, "amx", 32, 32, kFeatAmxKernels,
    kernels::int8_groups_fit<32>,
    kernels::amx_or_twin<&kernel_w8a8_avx512vnni, kernels::int_amx_gemm<kernels::AmxTiles, false>>,
    /*f32_acts=*/false, /*int_mins=*/true, /*int_scales=*/false, /*gathers_rows=*/kernels::amx_takes_tiles};

}  // namespace moe_cpu
