// w8a16_amx.cpp — INT8 weights x per-row INT16 activations (int8_w8a16) on AMX-INT8 tiles
// (kernels/int16_amx.h): the codes' high and low bytes in two dot products per tile step, bitwise the result
// of w8a16_avx512vnni, which runs experts with fewer than amx_min_rows() rows. Tile: 16 rows x 32 columns.
// Needs: AMX-TILE, AMX-INT8 (+ the AVX-512 of the int4 panel widening). Limits: groups a multiple of 32.
#define MOE_ISA amx  // kernels/isa.h: this file's ISA region
#include "kernels/int16_amx.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a16_avx512vnni;

extern const KernelDesc kernel_w8a16_amx{
    "w8a16_amx_16x32", Scheme::kInt8W8A16, "amx", 16, 32, kFeatAmxKernels, kernels::groups_aligned<32>,
    kernels::amx_or_twin<&kernel_w8a16_avx512vnni, kernels::int16_amx_gemm<kernels::AmxTiles, false>>,
    /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/false};

}  // namespace moe_cpu
