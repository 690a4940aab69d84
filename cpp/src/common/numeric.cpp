// numeric.cpp — float -> e4m3fn with round to nearest even, by rounding the float32 bits.
#include "common/numeric.h"

namespace moe_cpu {

uint8_t float_to_e4m3fn(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (!(a < 448.f)) return sign | 0x7e;  // saturate (and NaN, which callers exclude)
  if (a < 0.015625f) {                   // below 2^-6: subnormal steps of 2^-9; 8 steps is code 0x08
    return sign | uint8_t(std::nearbyint(a * 512.f));
  }
  uint32_t u = float_to_bits(a);
  u += 0x7ffffu + ((u >> 20) & 1u);  // round the 23-bit mantissa to 3 bits, ties to even
  const uint32_t code = (((u >> 23) - 120u) << 3) | ((u >> 20) & 7u);
  return sign | uint8_t(code > 0x7e ? 0x7e : code);
}

}  // namespace moe_cpu
