// int16_neon.h — the shared microkernel of w4a16_neon and w8a16_neon (A16: int16 activations, Armv8.0).
// A 64-byte panel row is 4 q-registers of 4 columns x 4 k bytes; each is widened to int16 (int8: the stored
// w + 128 flipped to w; int4: the nibble u in [0,15], or its signed codebook value through one TBL) and SMLAL
// multiplies it lane by lane with the row's 4 int16 codes of those k (ActRows::q16's a16_pos order put back
// in k order by one TBL), so each column keeps an int32x4 of partial sums over k mod 4, added pairwise at the
// end of each piece (at most kA16Piece channels: exact int32). Zero points (code_zero or stored) leave with
// the piece's code sum, mins with the group's, in fp32, as in the x86 kernels.
// Tile: one row x 16 columns (16 accumulators), the weights decoded once per row.
// Needs: AdvSIMD (Armv8.0).
#pragma once
#include <arm_neon.h>

#include <cstring>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// The 4 int16 codes at p (a16_pos order: k, k+2, k+1, k+3) as k, k+1, k+2, k+3 in both halves.
inline int16x8_t codes4(const int16_t* p) {
  static const uint8_t kIdx[16] = {0, 1, 4, 5, 2, 3, 6, 7, 0, 1, 4, 5, 2, 3, 6, 7};
  const uint8x8_t raw = vld1_u8(reinterpret_cast<const uint8_t*>(p));
  return vreinterpretq_s16_u8(vqtbl1q_u8(vcombine_u8(raw, raw), vld1q_u8(kIdx)));
}

// acc[0..4) += the 4 columns of w (4 k bytes each, widened) times the codes a, lane by lane.
inline void mlal4(int32x4_t* acc, int8x16_t w, bool is_unsigned, int16x8_t a) {
  const int16x8_t w01 = is_unsigned ? vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vreinterpretq_u8_s8(w))))
                                    : vmovl_s8(vget_low_s8(w));
  const int16x8_t w23 = is_unsigned ? vreinterpretq_s16_u16(vmovl_high_u8(vreinterpretq_u8_s8(w))) : vmovl_high_s8(w);
  acc[0] = vmlal_s16(acc[0], vget_low_s16(w01), vget_low_s16(a));
  acc[1] = vmlal_high_s16(acc[1], w01, a);
  acc[2] = vmlal_s16(acc[2], vget_low_s16(w23), vget_low_s16(a));
  acc[3] = vmlal_high_s16(acc[3], w23, a);
}

template <bool kInt4, bool kTbl = false>
struct Int16Neon {
  template <int MR, int NJ>
  struct Micro {
    static_assert(MR == 1 && NJ == 1, "one row x one 16-column panel");
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      constexpr int64_t step = kInt4 ? 8 : 4;
      const int64_t G = a.G, gl = w.group_len(), Kp = a.Kp, NP = a.NP, ps = kA16Piece / step;
      const uint8_t* panel = w.panel(e, b);
      const int16_t* arow = a.q16 + a.row_idx[r0] * Kp;
      const int32_t* asr = a.asum + a.row_idx[r0] * G * NP;
      const float* asf = w.has_mins ? a.asum_f32 + a.row_idx[r0] * G : nullptr;
      const int8x16_t table = vld1q_s8(w.codebook);
      // unsigned codes (int4 without a codebook) carry their zero point: code_zero, or stored per group
      const int zc = kInt4 && !kTbl && !w.has_zeros ? w.code_zero : 0;
      float32x4_t accf[4];
      for (int v = 0; v < 4; ++v) accf[v] = vdupq_n_f32(0.f);
      const ScaleIndex sx(w, e, b, G);
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t g0 = gi * gl / step, g1 = gi == G - 1 ? Kp / step : (gi + 1) * gl / step;
        for (int64_t pi = 0; pi < NP; ++pi) {
          const int64_t s0 = g0 + pi * ps, s1 = pi == NP - 1 ? g1 : s0 + ps, ai = gi * NP + pi;
          int32x4_t acc[16];
          for (int i = 0; i < 16; ++i) acc[i] = vdupq_n_s32(0);
          for (int64_t t = s0; t < s1; ++t) {
            const int16x8_t a0 = codes4(arow + t * step);
            const int16x8_t a1 = kInt4 ? codes4(arow + t * step + 4) : a0;
            for (int v = 0; v < 4; ++v) {
              const uint8x16_t raw = vld1q_u8(panel + t * 64 + v * 16);
              if constexpr (kInt4) {
                int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f)));
                int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
                if constexpr (kTbl) lo = vqtbl1q_s8(table, vreinterpretq_u8_s8(lo)), hi = vqtbl1q_s8(table, vreinterpretq_u8_s8(hi));
                mlal4(acc + 4 * v, lo, !kTbl, a0);
                mlal4(acc + 4 * v, hi, !kTbl, a1);
              } else {
                mlal4(acc + 4 * v, vreinterpretq_s8_u8(veorq_u8(raw, vdupq_n_u8(0x80))), false, a0);
              }
            }
          }
          for (int v = 0; v < 4; ++v) {
            const int64_t si = sx(0, gi) + v * 4;
            int32x4_t sum = vpaddq_s32(vpaddq_s32(acc[4 * v], acc[4 * v + 1]), vpaddq_s32(acc[4 * v + 2], acc[4 * v + 3]));
            int32x4_t zv = vdupq_n_s32(zc);
            if (kInt4 && w.has_zeros) {
              const uint8_t* z = w.zeros.data() + si;
              const int32_t zz[4] = {z[0], z[1], z[2], z[3]};
              zv = vld1q_s32(zz);
            }
            sum = vsubq_s32(sum, vmulq_n_s32(zv, asr[ai]));
            accf[v] = vfmaq_f32(accf[v], vcvtq_f32_s32(sum), vld1q_f32(w.scales.as<float>() + si));
            if (w.has_mins && pi == NP - 1)
              accf[v] = vfmsq_f32(accf[v], vld1q_f32(w.mins.as<float>() + si), vdupq_n_f32(asf[gi]));
          }
        }
      }
      const float rs = a.scale[a.row_idx[r0]];
      for (int v = 0; v < 4; ++v) {
        const int n0 = v * 4, valid = valid_cols(w, b) - n0;
        float tmp[4];
        vst1q_f32(tmp, vmulq_n_f32(accf[v], rs));
        if (valid > 0) std::memcpy(c + r0 * ldc + n0, tmp, size_t(valid < 4 ? valid : 4) * 4);
      }
    }
  };
};

// The int4 GEMM: codes through the codebook (TBL) when it is not the default identity coding.
inline void int4_a16_neon_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                               int64_t ldc) {
  if (w.code_shuffle) drive<Int16Neon<true, true>::Micro, 1, 1, 1>(w, e, b0, b1, a, c, ldc);
  else drive<Int16Neon<true>::Micro, 1, 1, 1>(w, e, b0, b1, a, c, ldc);
}

MOE_ISA_END
