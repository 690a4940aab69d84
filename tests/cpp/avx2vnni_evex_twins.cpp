// avx2vnni_evex_twins.cpp — test-only twins of w4a8_avx2vnni and w8a8_avx2vnni: the same microkernel
// source (int_avx2.h) with vpdpbusd ymm in its EVEX form (AVX512-VNNI + VL), whose semantics are
// identical to the VEX form the library ships. CPUs with AVX512-VNNI but no AVX-VNNI run these.
#define MOE_ISA avx2vnni_evex  // kernels/isa.h: int_avx2.h in the region of this word
#include "kernels/int_avx2.h"
#include "kernels/limits.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu::test {

constexpr uint64_t kTwinFeatures = kFeatAvx2 | kFeatAvx512 | kFeatAvx512Vnni;
const KernelDesc kW4a8Avx2VnniEvexTwin{
    "w4a8_avx2vnni_4x16_evex_twin", Scheme::kInt4W4A8, "avx2vnni", 4, 16, kTwinFeatures, nullptr,
    kernels::int4_avx2_gemm<kernels::IntDot::kVnniEvex, 4, 1, 2>, /*f32_acts=*/false, /*int_mins=*/true,
    /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};
const KernelDesc kW8a8Avx2VnniEvexTwin{
    "w8a8_avx2vnni_4x16_evex_twin", Scheme::kInt8W8A8, "avx2vnni", 4, 16, kTwinFeatures,
    kernels::int8_groups_fit<4>, kernels::int8_avx2_gemm<kernels::IntDot::kVnniEvex, 4, 1, 2>,
    /*f32_acts=*/false, /*int_mins=*/false, /*int_scales=*/true, /*gathers_rows=*/nullptr, /*half_scales=*/true};

extern const KernelDesc* const kEvexTwins[2] = {&kW4a8Avx2VnniEvexTwin, &kW8a8Avx2VnniEvexTwin};

}  // namespace moe_cpu::test
