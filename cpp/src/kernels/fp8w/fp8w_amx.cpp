// fp8w_amx.cpp — FP8 e4m3fn weights (block scales) x BF16 activations, AMX-BF16 (tdpbf16ps) after an
// exact e4m3 -> bf16 decode into a scratch per column pair and call, for experts with at least
// amx_min_rows() rows; fewer go to fp8w_avx512vbmi (fp32 sums in another order: float_amx.h).
// Tile: 32 rows x 32 columns (4 C tiles), K step 32; each K-block's sum times its block scale.
// Packed weights: common/layout.h fp8 panels.
// Needs: kFeatAmxKernels (AMX-TILE, INT8, BF16 with the tile state granted; AVX-512 VNNI, BF16, VBMI).
// Limits: block_k a multiple of 32 (or one K-block).
#define MOE_ISA amx  // kernels/isa.h: this file's ISA region
#include "kernels/float_amx.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_fp8w_avx512vbmi;

extern const KernelDesc kernel_fp8w_amx{
    "fp8w_amx_32x32", Scheme::kFp8W8A16, "amx", 32, 32, kFeatAmxKernels,
    kernels::groups_aligned<32>,
    kernels::amx_or_twin<&kernel_fp8w_avx512vbmi, kernels::float_amx_gemm<kernels::AmxTiles, true>>,
    /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/false, /*gathers_rows=*/kernels::amx_takes_tiles};

}  // namespace moe_cpu
