// activations.h — gated activations of GEMM1 gate and up values, in fp32.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "moe_cpu/types.h"

namespace moe_cpu::kernels {  // silu_mul per ISA word (kernels/silu_mul.h; the x86 words on x86 only)
namespace portable {
void silu_mul(const float*, const float*, int64_t, float*);
}
namespace avx2 {
void silu_mul(const float*, const float*, int64_t, float*);
}
namespace avx512 {
void silu_mul(const float*, const float*, int64_t, float*);
}
}  // namespace moe_cpu::kernels

namespace moe_cpu {

inline float silu(float g) { return g / (1.f + std::exp(-g)); }

// out[i] = silu(g[i]) * u[i] for i < n with Cephes' e^-g: one loop (kernels/silu_mul.h) compiled per ISA word,
// the widest the active ISA level has (activations.cpp); every level gives the same bits.
void silu_mul(const float* g, const float* u, int64_t n, float* out);

// gpt-oss: gate clamped above at 7, up to [-7, 7]; (u + 1) * g * sigmoid(1.702 g).
inline float swiglu_oai(float g, float u) {
  g = g > 7.f ? 7.f : g;
  u = u > 7.f ? 7.f : (u < -7.f ? -7.f : u);
  return (u + 1.f) * g / (1.f + std::exp(-1.702f * g));
}

// out[i] = act(g[i * st], u[i * st]) for i < n: the gated activation of gate and up values that
// GEMM1 produced (st = 2 when they are interleaved, gpt-oss style).
inline void gated_activation(Activation act, const float* g, const float* u, int64_t st, int64_t n, float* out) {
  constexpr float kSqrt1_2 = 0.70710678118654752f, kSqrt2OverPi = 0.79788456080286536f;
  switch (act) {
    case Activation::kSilu:
      if (st == 1) return silu_mul(g, u, n, out);
      for (int64_t i = 0; i < n; ++i) out[i] = silu(g[i * st]) * u[i * st];
      break;
    case Activation::kGelu:
      for (int64_t i = 0; i < n; ++i) {
        const float x = g[i * st];
        out[i] = 0.5f * x * (1.f + std::erf(x * kSqrt1_2)) * u[i * st];
      }
      break;
    case Activation::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float x = g[i * st];
        out[i] = 0.5f * x * (1.f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * u[i * st];
      }
      break;
    case Activation::kSwigluStep:
      for (int64_t i = 0; i < n; ++i) out[i] = std::min(silu(g[i * st]), 7.f) * std::clamp(u[i * st], -7.f, 7.f);
      break;
    case Activation::kSwigluOai:
    case Activation::kSwigluOaiUninterleave:
      for (int64_t i = 0; i < n; ++i) out[i] = swiglu_oai(g[i * st], u[i * st]);
      break;
  }
}

// True when GEMM1's gate and up columns alternate (gate 2i, up 2i + 1) rather than [gate; up].
inline bool gate_up_interleaved(Activation act) { return act == Activation::kSwigluOai; }

}  // namespace moe_cpu
