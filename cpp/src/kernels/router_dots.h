// router_dots.h — the router's fp32 dot products (MoELayer's logits, layer.cpp), one source for every ISA word:
// 16 lane sums over k (lane j takes k = j mod 16; multiply, then add: files built with -ffp-contract=off), then a
// fixed tree. GCC's vector type lowers to whatever the word's target has (xmm, ymm, NEON), so every word gives the
// same bits, and a row's logits do not depend on the rows beside it.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/isa.h"

MOE_ISA_BEGIN

typedef float v16f __attribute__((vector_size(64)));

inline float sum_tree(const v16f& v) {  // 16 -> 8 -> 4 -> 2 -> 1 (by reference: no vector ABI)
  float t[16];
  std::memcpy(t, &v, 64);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

template <int n>
void dots_rows(const float* x, int64_t ldx, const float* gate, int64_t H, int64_t e0, int64_t e1, int64_t ldo,
               float* out) {
  const int64_t Hm = H / 16 * 16;
  for (int64_t e = e0; e < e1; ++e) {
    const float* g = gate + e * H;
    v16f acc[n] = {};
    for (int64_t k = 0; k < Hm; k += 16) {
      v16f gv;
      std::memcpy(&gv, g + k, 64);
      for (int r = 0; r < n; ++r) {
        v16f xv;
        std::memcpy(&xv, x + r * ldx + k, 64);
        acc[r] += xv * gv;
      }
    }
    if (Hm < H) {  // the tail, zero-padded: adds +0 in the lanes past H
      float gt[16] = {}, xt[16];
      std::memcpy(gt, g + Hm, size_t(H - Hm) * 4);
      v16f gv;
      std::memcpy(&gv, gt, 64);
      for (int r = 0; r < n; ++r) {
        std::memset(xt, 0, 64);
        std::memcpy(xt, x + r * ldx + Hm, size_t(H - Hm) * 4);
        v16f xv;
        std::memcpy(&xv, xt, 64);
        acc[r] += xv * gv;
      }
    }
    for (int r = 0; r < n; ++r) out[r * ldo + e] = sum_tree(acc[r]);
  }
}

// out[r * ldo + e] = x[r] . gate[e] for rows r < n (n <= 4, rows of ldx floats, H used) and experts [e0, e1).
void router_dots(const float* x, int64_t n, int64_t ldx, const float* gate, int64_t H, int64_t e0, int64_t e1,
                 int64_t ldo, float* out) {
  switch (n) {
    case 1: dots_rows<1>(x, ldx, gate, H, e0, e1, ldo, out); break;
    case 2: dots_rows<2>(x, ldx, gate, H, e0, e1, ldo, out); break;
    case 3: dots_rows<3>(x, ldx, gate, H, e0, e1, ldo, out); break;
    default: dots_rows<4>(x, ldx, gate, H, e0, e1, ldo, out); break;
  }
}

MOE_ISA_END
