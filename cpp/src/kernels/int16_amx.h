// int16_amx.h — the shared kernel of w4a16_amx and w8a16_amx (and their _amx_model test twins): A16's int16
// activation codes on the int8 tiles in two parts, a = 256 h + l with h = a >> 8 (signed) and l = a & 255
// (unsigned): per 16-row block, C 0-1 += h x u (tdpbsud) and C 2-3 += l x u (tdpbuud) against the same B tiles
// (the unsigned weight bytes of int_amx.h: int8 panels in place, int4 widened through code_table), so a tile
// step costs two dot products, the rate of tdpbf16ps. Per piece of at most kA16Piece channels, 256 C_h + C_l
// minus zero * code sum is the exact int32 sum (wrapping, as in the AVX-512 kernel), and the epilogue applies
// int_avx512vnni.h's float operations in its order: the result is bitwise that of w*a16_avx512vnni.
// Needs the backend's features only. Limits: groups a multiple of 32 (or per channel).
#pragma once
#include <cmath>

#include "common/layout.h"
#include "kernels/amx_panels.h"
#include "kernels/amx_scratch.h"
#include "kernels/int_amx.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// The rows' int16 codes (a16_pos order) split into h and l bytes in k order: [round_up(R, 16)][Kt] each,
// zero past Kp and in the padding rows.
inline void split_rows(const ActRows& a, int64_t Kt, int8_t* hi, uint8_t* lo) {
  const int64_t R = a.rows, Rp = layout::round_up(R, 16);
  std::memset(hi, 0, size_t(Rp * Kt)), std::memset(lo, 0, size_t(Rp * Kt));
  for (int64_t r = 0; r < R; ++r) {
    const int16_t* q = a.q16 + a.row_idx[r] * a.Kp;
    for (int64_t k = 0; k < a.Kp; ++k) {
      const int v = q[a16_pos(k)];
      hi[r * Kt + k] = int8_t(v >> 8), lo[r * Kt + k] = uint8_t(v & 255);
    }
  }
}

template <class T, bool kInt4>
void int16_amx_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const int64_t R = a.rows, G = a.G, gl = w.group_len(), Kp = a.Kp, NP = a.NP;
  if (R == 0 || b0 >= b1) return;
  const int ka = G == 1 || gl % 64 == 0 ? 64 : 32;  // divides kA16Piece
  const int64_t Kt = layout::round_up(Kp, ka), Rp = layout::round_up(R, 16), steps = Kt / ka, ps = kA16Piece / ka;
  const int64_t brow = ka / 4 * 64;
  const bool mins = w.has_mins, zeros = w.has_zeros;
  const int zc = kInt4 ? w.code_zero : layout::implicit_zero(w.scheme);
  ScratchArena& ar = ScratchArena::get();
  ar.reset(2 * ScratchArena::piece(Rp * Kt, 1) + 2 * ScratchArena::piece(Kt * 16, 1) + 2 * ScratchArena::piece(brow, 1) +
           ScratchArena::piece(32 * 32, 4) * 2 + 3 * ScratchArena::piece(G * 32, 4));
  int8_t* Ah = ar.take<int8_t>(Rp * Kt);
  uint8_t* Al = ar.take<uint8_t>(Rp * Kt);
  uint8_t* Bw = kInt4 ? ar.take<uint8_t>(2 * Kt * 16) : nullptr;
  uint8_t* tail = ar.take<uint8_t>(2 * brow);
  int32_t* ci = ar.take<int32_t>(32 * 32);  // rows 0-15: the h sums, 16-31: the l sums (32 columns each)
  float* acc = ar.take<float>(32 * 32);
  IntPairTerms pt{ar.take<float>(G * 32), mins ? ar.take<float>(G * 32) : nullptr, zeros ? ar.take<int32_t>(G * 32) : nullptr};
  split_rows(a, Kt, Ah, Al);
  T::configure(tile_config(ka));
  for (int64_t b = b0; b < b1; b += 2) {
    const int64_t nj = std::min<int64_t>(2, b1 - b);
    const PairB<T, kInt4> bsrc(w, e, b, nj, Kt, brow, Bw, tail);
    pt.fill(w, e, b, nj, G);
    for (int64_t r0 = 0; r0 < R; r0 += 16) {
      const int64_t rr = std::min<int64_t>(16, R - r0);
      std::fill(acc, acc + 16 * 32, 0.f);
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t g0 = gi * gl / ka, g1 = gi == G - 1 ? steps : (gi + 1) * gl / ka;
        for (int64_t pi = 0; pi < NP; ++pi) {
          const int64_t s0 = g0 + pi * ps, s1 = pi == NP - 1 ? g1 : s0 + ps, ai = gi * NP + pi;
          T::template zero<0>(), T::template zero<1>(), T::template zero<2>(), T::template zero<3>();
          for (int64_t s = s0; s < s1; ++s) {
            T::template load<kTileA>(Ah + r0 * Kt + s * ka, Kt);
            T::template load<kTileA + 1>(Al + r0 * Kt + s * ka, Kt);
            T::template load<kTileB>(bsrc(0, s), 64);
            T::template dpbsud<0, kTileA, kTileB>(), T::template dpbuud<2, kTileA + 1, kTileB>();
            if (nj == 2) {
              T::template load<kTileB + 1>(bsrc(1, s), 64);
              T::template dpbsud<1, kTileA, kTileB + 1>(), T::template dpbuud<3, kTileA + 1, kTileB + 1>();
            }
          }
          uint8_t* cb = reinterpret_cast<uint8_t*>(ci);
          T::template store<0>(cb, 128), T::template store<1>(cb + 64, 128);
          T::template store<2>(cb + 16 * 128, 128), T::template store<3>(cb + 16 * 128 + 64, 128);
          const float* sc = pt.sc + gi * 32;
          for (int64_t r = 0; r < rr; ++r) {
            const uint32_t as = uint32_t(a.asum[a.row_idx[r0 + r] * G * NP + ai]);
            float* ac = acc + r * 32;
            for (int n = 0; n < 32; ++n) {
              const uint32_t z = zeros ? uint32_t(pt.zp[gi * 32 + n]) : uint32_t(zc);
              const uint32_t sum = uint32_t(ci[r * 32 + n]) * 256u + uint32_t(ci[(16 + r) * 32 + n]) - z * as;
              ac[n] = std::fma(float(int32_t(sum)), sc[n], ac[n]);
            }
          }
        }
        if (mins)
          for (int64_t r = 0; r < rr; ++r) {
            const float asf = a.asum_f32[a.row_idx[r0 + r] * G + gi];
            for (int n = 0; n < 32; ++n) acc[r * 32 + n] = std::fma(-pt.mn[gi * 32 + n], asf, acc[r * 32 + n]);
          }
      }
      for (int64_t r = 0; r < rr; ++r) {
        const float rs = a.scale[a.row_idx[r0 + r]];
        for (int64_t j = 0; j < nj; ++j) {
          const int vc = valid_cols(w, b + j);
          float* out = c + (r0 + r) * ldc + 16 * (b - b0 + j);
          for (int n = 0; n < vc; ++n) out[n] = acc[r * 32 + 16 * j + n] * rs;
        }
      }
    }
  }
  T::release();
}

MOE_ISA_END
