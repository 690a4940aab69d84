// region.cpp — the same helper and vector use, with the AVX-512 code in an ISA region (kernels/isa.h).
#define MOE_ISA avx512vnni
#include <immintrin.h>

#include <vector>

#include "kernels/isa.h"
#include "shared.h"

MOE_ISA_BEGIN
inline float dot16(const float* a, const float* b) {
  return _mm512_reduce_add_ps(_mm512_mul_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
}
inline float region_sum(float x) {
  std::vector<float> v(16, x);
  v.resize(40);
  const Config c = make_config(x);
  return dot16(c.v, v.data());
}
// A lambda in a lambda (its symbol nests two local scopes: _ZZZN...): still the region's.
inline float nested_sum(const float* a) {
  const auto outer = [&](int i) {
    const auto inner = [&](int j) { return _mm512_reduce_add_ps(_mm512_loadu_ps(a + 16 * (i + j))); };
    return inner(0) + inner(1);
  };
  return outer(0);
}
MOE_ISA_END

float call_region(float x) { return moe_cpu::kernels::region_sum(x); }
float call_nested(const float* a) { return moe_cpu::kernels::nested_sum(a); }
