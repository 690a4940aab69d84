// router_dots.h — the router's fp32 dot products (MoELayer's logits, layer.cpp), one source for every ISA word:
// 16 lane sums over k (lane j takes k = j mod 16; multiply, then add: files built with -ffp-contract=off), then a
// fixed tree. GCC's vector type lowers to whatever the word's target has (xmm, ymm, NEON), so every word gives the
// same bits, and a row's logits do not depend on the rows beside it. The gate is fp32, or (router_dots' uint16_t overload) the
// same values held as bf16 where each is one (a gate from a bf16 checkpoint): widened exactly, the same bits, half
// the bytes to read.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/isa.h"

MOE_ISA_BEGIN

// A lane sum vector of 16 floats as two 8-float halves: native on ymm (a 64-byte GCC vector on an AVX2 target
// went through the stack, 10x slower), two xmm / NEON registers elsewhere; lane for lane the same operations.
typedef float v8f __attribute__((vector_size(32)));

inline float sum_tree(const v8f (&v)[2]) {  // 16 -> 8 -> 4 -> 2 -> 1
  float t[16];
  std::memcpy(t, &v[0], 32);
  std::memcpy(t + 8, &v[1], 32);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

inline void load16(const float* p, v8f (&v)[2]) {
  std::memcpy(&v[0], p, 32);
  std::memcpy(&v[1], p + 8, 32);
}

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));
inline void load16(const uint16_t* p, v8f (&v)[2]) {  // bf16 bits: the float with them as its high half
  for (int i = 0; i < 2; ++i) {
    v8h h;
    std::memcpy(&h, p + 8 * i, 16);
    const v8u u = __builtin_convertvector(h, v8u) << 16;
    std::memcpy(&v[i], &u, 32);
  }
}

template <int n, class W>
void dots_rows(const float* x, int64_t ldx, const W* gate, int64_t H, int64_t e0, int64_t e1, int64_t ldo,
               float* out) {
  const int64_t Hm = H / 16 * 16;
  for (int64_t e = e0; e < e1; ++e) {
    const W* g = gate + e * H;
    v8f acc[n][2] = {};
    for (int64_t k = 0; k < Hm; k += 16) {
      v8f gv[2];
      load16(g + k, gv);
      for (int r = 0; r < n; ++r) {
        v8f xv[2];
        load16(x + r * ldx + k, xv);
        acc[r][0] += xv[0] * gv[0];
        acc[r][1] += xv[1] * gv[1];
      }
    }
    if (Hm < H) {  // the tail, zero-padded: adds +0 in the lanes past H
      W gt[16] = {};
      float xt[16];
      std::memcpy(gt, g + Hm, size_t(H - Hm) * sizeof(W));
      v8f gv[2];
      load16(gt, gv);
      for (int r = 0; r < n; ++r) {
        std::memset(xt, 0, 64);
        std::memcpy(xt, x + r * ldx + Hm, size_t(H - Hm) * 4);
        v8f xv[2];
        load16(xt, xv);
        acc[r][0] += xv[0] * gv[0];
        acc[r][1] += xv[1] * gv[1];
      }
    }
    for (int r = 0; r < n; ++r) out[r * ldo + e] = sum_tree(acc[r]);
  }
}

template <class W>
void dots_n(const float* x, int64_t n, int64_t ldx, const W* gate, int64_t H, int64_t e0, int64_t e1, int64_t ldo,
            float* out) {
  switch (n) {
    case 1: dots_rows<1>(x, ldx, gate, H, e0, e1, ldo, out); break;
    case 2: dots_rows<2>(x, ldx, gate, H, e0, e1, ldo, out); break;
    case 3: dots_rows<3>(x, ldx, gate, H, e0, e1, ldo, out); break;
    default: dots_rows<4>(x, ldx, gate, H, e0, e1, ldo, out); break;
  }
}

// out[r * ldo + e] = x[r] . gate[e] for rows r < n (n <= 4, rows of ldx floats, H used) and experts [e0, e1).
void router_dots(const float* x, int64_t n, int64_t ldx, const float* gate, int64_t H, int64_t e0, int64_t e1,
                 int64_t ldo, float* out) {
  dots_n(x, n, ldx, gate, H, e0, e1, ldo, out);
}
// The same with the gate as bf16 bits.
void router_dots(const float* x, int64_t n, int64_t ldx, const uint16_t* gate, int64_t H, int64_t e0, int64_t e1,
                 int64_t ldo, float* out) {
  dots_n(x, n, ldx, gate, H, e0, e1, ldo, out);
}

MOE_ISA_END
