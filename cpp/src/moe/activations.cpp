// activations.cpp — SiLU on contiguous gate and up values: one source (kernels/silu_mul.h) compiled per ISA word,
// the widest vectors the active ISA level has; the same bits on every level.
#include "moe/activations.h"

#include "moe_cpu/cpu_features.h"

namespace moe_cpu {

void silu_mul(const float* g, const float* u, int64_t n, float* out) {
#if defined(__x86_64__)
  const uint64_t f = active_features();
  if (f & kFeatAvx512) return kernels::avx512::silu_mul(g, u, n, out);
  if (f & kFeatAvx2) return kernels::avx2::silu_mul(g, u, n, out);
#endif
  kernels::portable::silu_mul(g, u, n, out);
}

}  // namespace moe_cpu
