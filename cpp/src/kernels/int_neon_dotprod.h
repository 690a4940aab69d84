// int_neon_dotprod.h — the shared microkernel of w4a8_neon_dotprod and w8a8_neon_dotprod.
// A 64-byte panel row is 4 q-registers of 4 columns x 4 k bytes; SDOT adds each column's 4 products
// into its int32 lane, against 4 activation bytes duplicated to every lane.
//   int4: u = nibble in [0,15] (AND 0x0f, or shift right 4); the zero point (code_zero or stored) is
//         removed per group with the group's activation sum, as in the x86 kernels. A codebook maps
//         u to its signed value with one TBL (no zero point).
// Group offsets (mins): minus min * code sum per group, in fp32. A8 activation blocks (ActRows::bscale): int32
// sums per piece (group, or block when shorter), each converted sum times its block scale.
//   int8: the stored u = w + 128 becomes w by flipping the top bit; the sums need no correction.
// Panels, scales and mins widened per call from the compact forms (int_neon_forms.h) come in ActRows::wpanels,
// blk_scales and blk_mins.
// Needs: AdvSIMD + dotprod (compile the users with -march=armv8.2-a+dotprod).
#pragma once
#include <arm_neon.h>

#include <cstring>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

inline int8x16_t dup4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

// kBlk: A8 activation blocks (ActRows::bscale), an instance of its own so that the per-token code stays as it was.
template <bool kInt4, bool kTbl = false, bool kBlk = false>
struct IntNeonDot {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      constexpr int64_t step = kInt4 ? 8 : 4;
      constexpr int V = 4 * NJ;  // q-registers of 4 columns
      const int64_t G = w.num_groups(), gl = w.group_len(), Kp = a.Kp;
      const uint8_t* panel[NJ];
      for (int j = 0; j < NJ; ++j) panel[j] = a.wpanels ? a.wpanels + (b + j - a.wpanel_b) * Kp * 16 : w.panel(e, b + j);
      const int8_t* arow[MR];
      for (int r = 0; r < MR; ++r) arow[r] = a.q + a.row_idx[r0 + r] * Kp;
      const int8x16_t table = vld1q_s8(w.codebook);
      float32x4_t accf[MR][V];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < V; ++v) accf[r][v] = vdupq_n_f32(0.f);
      const ScaleIndex sx(w, e, b);
      const int64_t NP = kBlk ? a.NP : 1, ps = NP > 1 ? a.pk / step : Kp;  // A8 blocks shorter than a group: pieces
      for (int64_t gi = 0; gi < G; ++gi) {
       const int64_t g0 = gi * gl / step, g1 = gi == G - 1 ? Kp / step : (gi + 1) * gl / step;
       for (int64_t pi = 0; pi < NP; ++pi) {
        const int64_t s0 = g0 + pi * ps, s1 = pi == NP - 1 ? g1 : s0 + ps, ai = gi * NP + pi;
        int32x4_t acc[MR][V];
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < V; ++v) acc[r][v] = vdupq_n_s32(0);
        for (int64_t t = s0; t < s1; ++t) {
          for (int v = 0; v < V; ++v) {
            const uint8x16_t raw = vld1q_u8(panel[v / 4] + t * 64 + (v % 4) * 16);
            if constexpr (kInt4) {
              int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f)));
              int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
              if constexpr (kTbl) lo = vqtbl1q_s8(table, vreinterpretq_u8_s8(lo)), hi = vqtbl1q_s8(table, vreinterpretq_u8_s8(hi));
              for (int r = 0; r < MR; ++r) {
                acc[r][v] = vdotq_s32(acc[r][v], lo, dup4(arow[r] + t * 8));
                acc[r][v] = vdotq_s32(acc[r][v], hi, dup4(arow[r] + t * 8 + 4));
              }
            } else {
              const int8x16_t wv = vreinterpretq_s8_u8(veorq_u8(raw, vdupq_n_u8(0x80)));
              for (int r = 0; r < MR; ++r) acc[r][v] = vdotq_s32(acc[r][v], wv, dup4(arow[r] + t * 4));
            }
          }
        }
        for (int v = 0; v < V; ++v) {
          const int64_t si = sx(v / 4, gi) + (v % 4) * 4;
          const int64_t bi = ((b + v / 4 - a.wpanel_b) * G + gi) * 16 + (v % 4) * 4;  // in blk_scales / blk_mins
          const float32x4_t sv = vld1q_f32(a.blk_scales ? a.blk_scales + bi : w.scales.as<float>() + si);
          int32x4_t zv = vdupq_n_s32(kInt4 && !kTbl ? w.code_zero : 0);
          if (kInt4 && w.has_zeros) {
            const uint8_t* z = w.zeros.data() + si;
            const int32_t zz[4] = {z[0], z[1], z[2], z[3]};
            zv = vld1q_s32(zz);
          }
          for (int r = 0; r < MR; ++r) {
            const int64_t row = a.row_idx[r0 + r];
            const int32x4_t corr = vmulq_n_s32(zv, a.asum[row * G * NP + ai]);
            float32x4_t exact = vcvtq_f32_s32(vsubq_s32(acc[r][v], corr));
            if constexpr (kBlk) exact = vmulq_n_f32(exact, a.bscale[row * G * NP + ai]);
            accf[r][v] = vfmaq_f32(accf[r][v], exact, sv);
            if (w.has_mins && pi == NP - 1)
              accf[r][v] = vfmsq_f32(accf[r][v], vld1q_f32(a.blk_mins ? a.blk_mins + bi : w.mins.as<float>() + si), vdupq_n_f32(a.asum_f32[row * G + gi]));
          }
        }
       }
      }
      for (int r = 0; r < MR; ++r) {
        const float rs = a.scale[a.row_idx[r0 + r]];
        for (int v = 0; v < V; ++v) {
          const int n0 = (v % 4) * 4, valid = valid_cols(w, b + v / 4) - n0;
          float tmp[4];
          vst1q_f32(tmp, vmulq_n_f32(accf[r][v], rs));
          if (valid > 0) std::memcpy(c + (r0 + r) * ldc + (v / 4) * 16 + n0, tmp, size_t(valid < 4 ? valid : 4) * 4);
        }
      }
    }
  };
};

MOE_ISA_END
