// activations.h — gated activations on one GEMM1 output row y[2I] -> out[I], in fp32.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "moe_cpu/types.h"

namespace moe_cpu {

inline float silu(float g) { return g / (1.f + std::exp(-g)); }

// gpt-oss: gate clamped above at 7, up to [-7, 7]; (u + 1) * g * sigmoid(1.702 g).
inline float swiglu_oai(float g, float u) {
  g = g > 7.f ? 7.f : g;
  u = u > 7.f ? 7.f : (u < -7.f ? -7.f : u);
  return (u + 1.f) * g / (1.f + std::exp(-1.702f * g));
}

inline void apply_activation(Activation act, const float* y, int64_t I, float* out) {
  constexpr float kSqrt1_2 = 0.70710678118654752f, kSqrt2OverPi = 0.79788456080286536f;
  switch (act) {
    case Activation::kSilu:
      for (int64_t i = 0; i < I; ++i) out[i] = silu(y[i]) * y[I + i];
      break;
    case Activation::kGelu:
      for (int64_t i = 0; i < I; ++i) {
        const float g = y[i];
        out[i] = 0.5f * g * (1.f + std::erf(g * kSqrt1_2)) * y[I + i];
      }
      break;
    case Activation::kGeluTanh:
      for (int64_t i = 0; i < I; ++i) {
        const float g = y[i];
        out[i] = 0.5f * g * (1.f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * y[I + i];
      }
      break;
    case Activation::kSwigluStep:
      for (int64_t i = 0; i < I; ++i)
        out[i] = std::min(silu(y[i]), 7.f) * std::clamp(y[I + i], -7.f, 7.f);
      break;
    case Activation::kSwigluOai:  // gate and up interleaved
      for (int64_t i = 0; i < I; ++i) out[i] = swiglu_oai(y[2 * i], y[2 * i + 1]);
      break;
    case Activation::kSwigluOaiUninterleave:
      for (int64_t i = 0; i < I; ++i) out[i] = swiglu_oai(y[i], y[I + i]);
      break;
  }
}

}  // namespace moe_cpu
