// int_amx.h — the shared kernel of w8a8_amx and w4a8_amx (and their _amx_model test twins): tdpbsud
// (signed activation bytes x unsigned weight bytes) on a tile backend T (amx_tiles.h).
// Tiles (amx_scratch.h): 32 rows x 32 columns of int32 sums in C 0-3; A 4-5: 16 rows x ka activation
// codes (TileRows: in place or gathered); B 6-7: ka/4 rows of 16 columns x 4 bytes, which is a VNNI panel row as
// stored (int8: u = w + 128, read in place); int4 codes are widened to one byte each (through
// code_table) into a scratch once per column pair and call. ka = 64 k per tile step (32 for groups of 32).
// Per scale group the C tiles are stored and a plain C++ epilogue applies the float operations of
// int_avx512vnni.h in its order: (sum - zero * code sum) converted, times the scale, fused into the
// running sum (A8 activation blocks: per piece, the converted sum times its block scale first); minus
// min * code sum (fused); integer mins per run; times the row scale. So the
// result is bitwise that of w*a8_avx512vnni, and choosing between the two per expert changes no bit.
// Needs the backend's features only. Limits: groups a multiple of 32 (or per channel); int8 group <= 65536.
#pragma once
#include <cmath>

#include "common/layout.h"
#include "kernels/amx_panels.h"
#include "kernels/amx_scratch.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// The per (column, group) terms of column pair [b, b + nj), 32 columns per group.
struct IntPairTerms {
  float *sc, *mn;      // scales, float mins (or nullptr)
  int32_t* zp;         // stored zero points (or nullptr)
  void fill(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t G) {
    const ScaleIndex sx(w, e, b, G);
    const IntFormBlock f(w, e, b, G);
    for (int64_t j = 0; j < nj; ++j)
      for (int64_t gi = 0; gi < G; ++gi)
        for (int n = 0; n < 16; ++n) {
          const int64_t i = gi * 32 + 16 * j + n, si = sx(j, gi) + n;
          sc[i] = f.isc ? float(f.isc_at(j, gi)[n]) * half_to_float(f.dsc_at(j, gi)[n]) : w.scales.as<float>()[si];
          if (mn) mn[i] = w.mins.as<float>()[si];
          if (zp) zp[i] = w.zeros.data()[si];
        }
  }
};

// corr[n] = integer mins term of one row: per run, the int32 sum of imin * code sum over its groups (with activation
// blocks of 2 or 4 groups, per block, times its scale, fused in order), times dmin, fused into the sum over runs
// (int_mins_term in int_avx512vnni.h, one row).
inline void int_mins_row(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, const ActRows& a, int64_t row,
                         float* corr) {
  const IntFormBlock f(w, e, b, a.G);
  const bool short_blocks = a.bscale && imins_f32(w);  // activation blocks shorter than a run
  const int64_t nb = short_blocks ? run_block_groups(w) : kIMinRun;
  if (short_blocks && nb != 2 && nb != 4) {  // int_mins_term_f32's order
    const float* af = a.asum_f32 + row * a.G;
    for (int64_t j = 0; j < nj; ++j)
      for (int n = 0; n < 16; ++n) {
        float sum = 0.f;
        for (int64_t s = 0; s < f.runs; ++s) {
          float acc = 0.f;
          for (int64_t p = s * (kIMinRun / 2); p < std::min((a.G + 1) / 2, (s + 1) * (kIMinRun / 2)); ++p) {
            const int8_t* m = f.imn_pair(j, p) + 2 * n;
            acc = std::fma(float(m[0]), af[2 * p], acc);
            acc = std::fma(float(m[1]), 2 * p + 1 < a.G ? af[2 * p + 1] : 0.f, acc);
          }
          sum = std::fma(acc, half_to_float(f.dmn_run(j, s)[n]), sum);
        }
        corr[16 * j + n] = sum;
      }
    return;
  }
  // each block's int32 sum (a run, or 2 / 4 groups of it) converted, times its block scale, fused in order
  const int16_t* as = a.asum16 + row * a.G2;
  const float* bs = a.bscale ? a.bscale + row * a.G : nullptr;
  for (int64_t j = 0; j < nj; ++j)
    for (int n = 0; n < 16; ++n) {
      float sum = 0.f;
      for (int64_t s = 0; s < f.runs; ++s) {
        float x = 0.f;
        for (int64_t k = 0; k < kIMinRun / nb; ++k) {
          const int64_t g = s * kIMinRun + k * nb;
          if (k > 0 && g >= a.G) break;  // the last run's padding
          uint32_t acc = 0;
          for (int64_t gi = g; gi < g + nb; gi += 2) {
            const int8_t* m = f.imn_pair(j, gi / 2) + 2 * n;
            acc += uint32_t(int32_t(m[0]) * as[gi] + int32_t(m[1]) * as[gi + 1]);
          }
          const float bsc = bs ? bs[g] : 1.f;
          x = k == 0 ? float(int32_t(acc)) * bsc : std::fma(float(int32_t(acc)), bsc, x);
        }
        sum = std::fma(x, half_to_float(f.dmn_run(j, s)[n]), sum);
      }
      corr[16 * j + n] = sum;
    }
}

// The B tiles of column pair [b, b + nj) at k-step s, bsrc(j, s): int4 codes widened once (through code_table)
// into Bw [2][Kt / 4][64], int8 panel rows read in place (the last partial step from `tail`). Shared with
// int16_amx.h.
template <class T, bool kInt4>
struct PairB {
  const uint8_t* Bw;
  int64_t Kt, brow;
  PanelSteps panel;
  PairB(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t Kt_, int64_t brow_, uint8_t* Bw_, uint8_t* tail)
      : Bw(Bw_), Kt(Kt_), brow(brow_), panel(w, e, b, kInt4 ? 0 : nj, brow_, tail) {
    if constexpr (kInt4 && T::kSimdPanels) amx::widen_int4_avx512(w, e, b, nj, Kt_, Bw_);
    else if constexpr (kInt4) widen_int4(w, e, b, nj, Kt_, Bw_);
  }
  const uint8_t* operator()(int64_t j, int64_t s) const {
    if constexpr (kInt4) return Bw + j * Kt * 16 + s * brow;
    else return panel(j, s);
  }
};

template <class T, bool kInt4>
void int_amx_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const int64_t R = a.rows, G = a.G, gl = w.group_len(), Kp = a.Kp, NP = a.NP, pl = NP > 1 ? a.pk : gl;
  if (R == 0 || b0 >= b1) return;
  const int ka = (G == 1 && NP == 1) || pl % 64 == 0 ? 64 : 32;  // divides every piece (group, or A8 block)
  const int64_t Kt = layout::round_up(Kp, ka), Rp = layout::round_up(R, 16), steps = Kt / ka;
  const int64_t brow = ka / 4 * 64;  // bytes of one B tile (ka / 4 rows of 64)
  const bool mins = w.has_mins && !w.imin_groups, imins = w.has_mins && w.imin_groups, zeros = w.has_zeros;
  const int zc = kInt4 ? w.code_zero : layout::implicit_zero(w.scheme);
  ScratchArena& ar = ScratchArena::get();
  ar.reset(ScratchArena::piece(Rp * Kt, 1) + 2 * ScratchArena::piece(Kt * 16, 1) + 2 * ScratchArena::piece(brow, 1) +
           ScratchArena::piece(32 * 32, 4) * 3 + 3 * ScratchArena::piece(G * 32, 4));
  int8_t* A = ar.take<int8_t>(Rp * Kt);
  uint8_t* Bw = kInt4 ? ar.take<uint8_t>(2 * Kt * 16) : nullptr;  // widened int4 codes, [2][Kt / 4][64]
  uint8_t* tail = ar.take<uint8_t>(2 * brow);                     // int8: the last partial k-step of each panel
  int32_t* ci = ar.take<int32_t>(32 * 32);
  float* acc = ar.take<float>(32 * 32);
  float* corr = ar.take<float>(32 * 32);
  IntPairTerms pt{ar.take<float>(G * 32), mins ? ar.take<float>(G * 32) : nullptr, zeros ? ar.take<int32_t>(G * 32) : nullptr};
  const TileRows rows(a.q, a.row_idx, R, Kp, Kt, 1, reinterpret_cast<uint8_t*>(A));
  T::configure(tile_config(ka));
  for (int64_t b = b0; b < b1; b += 2) {
    const int64_t nj = std::min<int64_t>(2, b1 - b);
    const PairB<T, kInt4> bsrc(w, e, b, nj, Kt, brow, Bw, tail);
    pt.fill(w, e, b, nj, G);
    // One piece ai (a scale group, or an A8 block inside one: NP per group) of the block's rows.
    const auto group = [&](int64_t ai, int64_t r0, int64_t rr) {
      if (ai == 0) std::fill(acc, acc + 32 * 32, 0.f);
      const int64_t gi = ai / NP;
      const float* sc = pt.sc + gi * 32;
      for (int64_t r = 0; r < rr; ++r) {
        const int64_t row = a.row_idx[r0 + r];
        const int32_t as = a.asum[row * G * NP + ai];
        const float bs = a.bscale ? a.bscale[row * G * NP + ai] : 1.f;  // x * 1 is x: per-row scales unchanged
        const int32_t* cr = ci + r * 32;
        float* ac = acc + r * 32;
        if (zeros)
          for (int n = 0; n < 32; ++n) ac[n] = std::fma(float(int32_t(uint32_t(cr[n]) - uint32_t(pt.zp[gi * 32 + n] * as))) * bs, sc[n], ac[n]);
        else
          for (int n = 0; n < 32; ++n) ac[n] = std::fma(float(int32_t(uint32_t(cr[n]) - uint32_t(zc * as))) * bs, sc[n], ac[n]);
        if (mins && ai % NP == NP - 1) {
          const float asf = a.asum_f32[a.row_idx[r0 + r] * G + gi];
          for (int n = 0; n < 32; ++n) ac[n] = std::fma(-pt.mn[gi * 32 + n], asf, ac[n]);
        }
      }
    };
    const auto done = [&](int64_t r0, int64_t rr) {
      for (int64_t r = 0; r < rr; ++r) {
        const int64_t row = a.row_idx[r0 + r];
        if (imins) int_mins_row(w, e, b, nj, a, row, corr + r * 32);
        const float rs = a.scale[row];
        for (int64_t j = 0; j < nj; ++j) {
          const int vc = valid_cols(w, b + j);
          float* out = c + (r0 + r) * ldc + 16 * (b - b0 + j);
          const float* ac = acc + r * 32 + 16 * j;
          if (imins)
            for (int n = 0; n < vc; ++n) out[n] = (ac[n] - corr[r * 32 + 16 * j + n]) * rs;
          else
            for (int n = 0; n < vc; ++n) out[n] = ac[n] * rs;
        }
      }
    };
    row_blocks<T, false>(rows, R, G * NP, pl, ka, ka, steps, nj, bsrc, ci, group, done);
  }
  T::release();
}

MOE_ISA_END
