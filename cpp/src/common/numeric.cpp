// numeric.cpp — float -> e4m3fn by searching the 127 non-negative finite codes (exact, no bit tricks).
#include "common/numeric.h"

namespace moe_cpu {

uint8_t float_to_e4m3fn(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.f) return sign | 0x7e;
  // Codes 0..0x7e are monotonic in value; binary search for the last code with value <= a.
  int lo = 0, hi = 0x7e;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (e4m3fn_to_float(uint8_t(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  const float below = e4m3fn_to_float(uint8_t(lo));
  if (below == a) return sign | uint8_t(lo);
  const float above = e4m3fn_to_float(uint8_t(lo + 1));
  const float d_lo = a - below, d_hi = above - a;
  int code = lo;
  if (d_hi < d_lo || (d_hi == d_lo && (lo & 1))) code = lo + 1;  // ties to even mantissa
  return sign | uint8_t(code);
}

}  // namespace moe_cpu
