// fp8w_amx_model.cpp — fp8w_amx's kernel (float_amx.h) on the scalar tile model (amx_tiles.h), for every
// row count: the ISA level `amx_model` runs the AMX code on any x86 host. A test path, not a speed path.
// Needs: nothing (portable code). Limits: as fp8w_amx.
#define MOE_ISA amx_model  // kernels/isa.h: this file's ISA region
#include "kernels/float_amx.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_fp8w_amx_model{
    "fp8w_amx_model_32x32", Scheme::kFp8W8A16, "amx_model", 32, 32, kFeatAmxModel, kernels::groups_aligned<32>,
    kernels::float_amx_gemm<kernels::TileModel, true>, /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/false,
    /*gathers_rows=*/kernels::model_takes_tiles};

}  // namespace moe_cpu
