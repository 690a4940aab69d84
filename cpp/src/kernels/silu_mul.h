// silu_mul.h — out = SiLU(g) * u on contiguous values (fused_moe's GEMM1 epilogue, moe/activations.cpp), one source
// for every ISA word: a loop GCC vectorizes to the word's widest vectors. Its files are built with -ffp-contract=off
// (multiply, then add) and -fno-trapping-math (the clamps become min / max): CMakeLists.txt. Every element takes the
// same IEEE operations on every word, so every word gives the same bits.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/isa.h"

MOE_ISA_BEGIN

// e^x in fp32 as Cephes' expf computes it: x = n ln2 + r (ln2 in two parts), a degree-6 polynomial in r, times
// 2^n; within 2 ulp of libm's expf. Above 88.7 it is inf (as expf's overflow); below -87.3, e^-87.3 (2^n stays a
// normal number; NaN passes).
inline float exp_poly(float x0) {
  float x = x0 < -87.3f ? -87.3f : x0;
  x = x > 88.f ? 88.f : x;
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // the nearest integer (1.5 * 2^23)
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const int32_t bits = int32_t(uint32_t(int32_t(n == n ? n : 0.f) + 127) << 23);  // n in [-126, 127]; NaN: p is NaN
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x0 > 88.7f ? __builtin_inff() : p * scale;
}

void silu_mul(const float* g, const float* u, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.f + exp_poly(-g[i])) * u[i];
}

MOE_ISA_END
