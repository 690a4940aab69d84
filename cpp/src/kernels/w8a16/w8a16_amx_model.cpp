// w8a16_amx_model.cpp — w8a16_amx's code on the scalar tile model (kernels/amx_tiles.h TileModel): the AMX
// kernel's tests on every x86 host (ISA level amx_model). Not a speed path.
#define MOE_ISA amx_model  // kernels/isa.h: this file's ISA region
#include "kernels/int16_amx.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_w8a16_amx_model{
    "w8a16_amx_model_16x32", Scheme::kInt8W8A16, "amx_model", 16, 32, kFeatAmxModel, kernels::groups_aligned<32>,
    kernels::int16_amx_gemm<kernels::TileModel, false>, /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/false};

}  // namespace moe_cpu
