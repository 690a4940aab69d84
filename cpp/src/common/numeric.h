// numeric.h — bf16 and fp8 e4m3fn conversions, per-row int8 activation quantization.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace moe_cpu {

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float bf16_to_float(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }
// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// IEEE fp16 (1 sign, 5 exponent with bias 15, 10 mantissa) to fp32: exact.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) return bits_to_float(sign | float_to_bits(std::ldexp(float(m), -24)));  // zero, subnormal
  if (e == 31) return bits_to_float(sign | 0x7f800000u | (m << 13));
  return bits_to_float(sign | ((e + 112) << 23) | (m << 13));
}
// The fp16 code of f when f is exactly a finite fp16 value (signed zeros too), else false.
inline bool half_exact(float f, uint16_t* h) {
  const uint32_t u = float_to_bits(f), sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xff;
  const uint32_t man = (u & 0x7fffffu) | 0x800000u;
  uint32_t code;
  if ((u & 0x7fffffffu) == 0) code = sign;
  else if (exp == 0xff || exp > 142 || exp < 103) return false;  // inf / NaN, above 65504, below 2^-24
  else if (exp >= 113) code = sign | ((exp - 112) << 10) | ((man >> 13) & 0x3ff);
  else code = sign | (man >> (126 - exp));  // subnormal: m * 2^-24
  *h = uint16_t(code);
  return float_to_bits(half_to_float(*h)) == u;
}

// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf; S.1111.111 is NaN; max 448.
inline float e4m3fn_to_float(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80) << 24;
  const uint32_t exp = (c >> 3) & 0xf, man = c & 0x7;
  if (exp == 0xf && man == 0x7) return bits_to_float(sign | 0x7fc00000u);
  if (exp == 0) return (c & 0x80 ? -1.f : 1.f) * std::ldexp(float(man), -9);  // subnormal
  return bits_to_float(sign | ((exp + 120) << 23) | (man << 20));
}
inline bool e4m3fn_is_nan(uint8_t c) { return (c & 0x7f) == 0x7f; }
// Round to nearest even, saturating to +-448 (finite input).
uint8_t float_to_e4m3fn(float f);

// Per-row symmetric int8 from the row's amax = max |x| (finite): s = amax/127 (1 for an all-zero
// row), q = rint(x/s) in [-127,127].
inline void quantize_row_int8_amax(const float* x, int64_t n, float amax, int8_t* q, float* s) {
  const float sc = amax == 0.f ? 1.f : amax / 127.f;
  // |x/sc| <= 127 (+ rounding): adding and subtracting 1.5 * 2^23 rounds half to even in float32.
  constexpr float kMagic = 12582912.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = (x[i] / sc + kMagic) - kMagic;
    q[i] = int8_t(std::min(127.f, std::max(-127.f, v)));
  }
  *s = sc;
}

// Per-row symmetric int16 (A16 int schemes) from the row's finite amax: s = amax/32767 (1 for an
// all-zero row), code of x[i] = rint(x[i]/s) in [-32767, 32767], written at q[pos(i)].
template <class Pos>
inline void quantize_row_int16_amax(const float* x, int64_t n, float amax, int16_t* q, float* s, Pos pos) {
  const float sc = amax == 0.f ? 1.f : amax / 32767.f;
  constexpr float kMagic = 12582912.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = (x[i] / sc + kMagic) - kMagic;
    q[pos(i)] = int16_t(std::min(32767.f, std::max(-32767.f, v)));
  }
  *s = sc;
}

// amax = max |x[0..n)|, or a negative value if x has a non-finite value. Eight independent lanes, so that the
// compiler vectorizes the loop (a max is exact in any order); a NaN fails `<=` in its lane.
inline float row_amax(const float* x, int64_t n) {
  float m[8] = {}, fin[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float ax = std::fabs(x[i + j]);
      m[j] = ax > m[j] ? ax : m[j];
      fin[j] += ax <= 3.40282347e38f ? 0.f : 1.f;
    }
  float amax = 0.f, bad = 0.f;
  for (; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    amax = ax > amax ? ax : amax;
    bad += ax <= 3.40282347e38f ? 0.f : 1.f;
  }
  for (int j = 0; j < 8; ++j) amax = m[j] > amax ? m[j] : amax, bad += fin[j];
  return bad != 0.f ? -1.f : amax;
}

// The same, amax found here. Returns false if the row has a non-finite value (q is then unspecified).
inline bool quantize_row_int8(const float* x, int64_t n, int8_t* q, float* s) {
  const float amax = row_amax(x, n);
  if (amax < 0.f) return false;  // any x NaN or inf
  quantize_row_int8_amax(x, n, amax, q, s);
  return true;
}

}  // namespace moe_cpu
