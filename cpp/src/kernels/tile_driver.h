// tile_driver.h — walks a kernel's register tiles over (column blocks [b0, b1)) x (rows): column
// pairs outside, row tiles inside, so a 32-column weight panel stays in L1/L2 across row tiles.
// Micro<MR, NJ>::run(w, e, b, a, r0, c, ldc) computes rows [r0, r0+MR) x blocks [b, b+NJ).
#pragma once
#include <algorithm>
#include <cstdint>

#include "dispatch/registry.h"

namespace moe_cpu::kernels {

template <template <int, int> class Micro, int MR>
void drive(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  int64_t b = b0;
  if (a.rows < MR)  // few rows (decode): four column panels at once for more memory parallelism
    for (; b + 4 <= b1; b += 4)
      for (int64_t r = 0; r < a.rows; ++r) Micro<1, 4>::run(w, e, b, a, r, c + (b - b0) * 16, ldc);
  for (; b < b1; b += 2) {
    const bool two = b + 1 < b1;
    float* cb = c + (b - b0) * 16;
    int64_t r = 0;
    for (; r + MR <= a.rows; r += MR)
      two ? Micro<MR, 2>::run(w, e, b, a, r, cb, ldc) : Micro<MR, 1>::run(w, e, b, a, r, cb, ldc);
    for (; r < a.rows; ++r)
      two ? Micro<1, 2>::run(w, e, b, a, r, cb, ldc) : Micro<1, 1>::run(w, e, b, a, r, cb, ldc);
  }
}

// Valid columns of block b (the last block of a matrix may be cut at N).
inline int valid_cols(const PackedExperts& w, int64_t b) {
  return int(std::min<int64_t>(16, w.out_features - 16 * b));
}

}  // namespace moe_cpu::kernels
