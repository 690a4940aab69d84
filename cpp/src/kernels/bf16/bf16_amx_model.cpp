// bf16_amx_model.cpp — bf16_amx's kernel (float_amx.h) on the scalar tile model (amx_tiles.h), for every
// row count: the ISA level `amx_model` runs the AMX code on any x86 host. A test path, not a speed path.
// Needs: nothing (portable code). Limits: any M, N, K.
#define MOE_ISA amx_model  // kernels/isa.h: this file's ISA region
#include "kernels/float_amx.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

extern const KernelDesc kernel_bf16_amx_model{
    "bf16_amx_model_32x32", Scheme::kBf16, "amx_model", 32, 32, kFeatAmxModel, nullptr,
    kernels::float_amx_gemm<kernels::TileModel, false>, /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/false,
    /*gathers_rows=*/kernels::model_takes_tiles};

}  // namespace moe_cpu
