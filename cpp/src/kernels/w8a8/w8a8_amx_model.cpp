// w8a8_amx_model.cpp — w8a8_amx's kernel (int_amx.h) on the scalar tile model (amx_tiles.h), for every
// row count: the ISA level `amx_model` runs the AMX code on any x86 host. A test path, not a speed path.
// Needs: nothing (portable code). Limits: as w8a8_amx.
#define MOE_ISA amx_model  // kernels/isa.h: this file's ISA region
#include "kernels/int_amx.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w8a8_amx_model{
    "w8a8_amx_model_32x32", Scheme::kInt8W8A8, "amx_model", 32, 32, kFeatAmxModel,
    kernels::int8_groups_fit<32>, kernels::int_amx_gemm<kernels::TileModel, false>, /*f32_acts=*/false,
    /*int_mins=*/true, /*int_scales=*/false, /*gathers_rows=*/kernels::model_takes_tiles};

}  // namespace moe_cpu
