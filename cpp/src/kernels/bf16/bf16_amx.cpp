// bf16_amx.cpp — BF16 weights x BF16 activations, AMX-BF16 (tdpbf16ps), for experts with at least
// amx_min_rows() rows; fewer go to bf16_avx512bf16 (fp32 sums in another order: float_amx.h).
// Tile: 32 rows x 32 columns (4 C tiles), K step 32.
// Packed weights: common/layout.h bf16 panels, read in place as B tiles.
// Needs: kFeatAmxKernels (AMX-TILE, INT8, BF16 with the tile state granted; AVX-512 VNNI, BF16, VBMI).
// Limits: any M, N, K.
#define MOE_ISA amx  // kernels/isa.h: this file's ISA region
#include "kernels/float_amx.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_bf16_avx512bf16;

extern const KernelDesc kernel_bf16_amx{
    "bf16_amx_32x32", Scheme::kBf16, "amx", 32, 32, kFeatAmxKernels,
    nullptr,
    kernels::amx_or_twin<&kernel_bf16_avx512bf16, kernels::float_amx_gemm<kernels::AmxTiles, false>>,
    /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/false, /*gathers_rows=*/kernels::amx_takes_tiles};

}  // namespace moe_cpu
