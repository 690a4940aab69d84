// int_neon_i8mm.h — the shared microkernel of w4a8_neon_i8mm and w8a8_neon_i8mm (SMMLA).
// SMMLA multiplies a 2x8 int8 block of activations (two rows, 8 k) by an 8x2 block of weights (two
// columns) into a 2x2 int32 tile. Two 4-k quarters of the panel (int8: rows t and t+1; int4: the
// low and high nibbles of row t) zipped by 32-bit lanes give the columns' 8-k operands.
//   int4: u in [0,15]; zero point removed per group with the activation sums (as the x86 kernels);
//         a codebook maps u to its signed value with one TBL (no zero point).
// Group offsets (mins): minus min * code sum per group, in fp32. A8 activation blocks (ActRows::bscale): int32
// sums per piece (group, or block when shorter), each converted sum times its block scale.
//   int8: stored w + 128 with the top bit flipped back to w; no correction.
// Accumulators hold [r0c0, r0c1, r1c0, r1c1] per (row pair, column pair). An odd last row is paired
// with a copy of itself and its results dropped.
// Needs: AdvSIMD + i8mm (compile the users with -march=armv8.2-a+i8mm).
#pragma once
#include <arm_neon.h>

#include <cstring>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// kBlk: A8 activation blocks (ActRows::bscale), an instance of its own so that the per-token code stays as it was.
template <bool kInt4, bool kTbl = false, bool kBlk = false>
struct IntNeonMmla {
  template <int MR, int NJ>
  struct Micro {
    static constexpr int RP = (MR + 1) / 2, CP = 8 * NJ;  // row pairs, column pairs
    // 8 activation bytes of row r at k (zero past the row's padded length).
    static int8x8_t act8(const int8_t* row, int64_t k, int64_t Kp) {
      if (k + 8 <= Kp) return vld1_s8(row + k);
      int8_t tmp[8] = {};
      std::memcpy(tmp, row + k, size_t(Kp - k));
      return vld1_s8(tmp);
    }
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      const int64_t G = w.num_groups(), gl = w.group_len(), Kp = a.Kp;
      const uint8_t* panel[NJ];
      for (int j = 0; j < NJ; ++j) panel[j] = a.wpanels ? a.wpanels + (b + j - a.wpanel_b) * Kp * 16 : w.panel(e, b + j);
      const int8_t* arow[2 * RP];
      int64_t rid[2 * RP];
      for (int r = 0; r < 2 * RP; ++r) rid[r] = a.row_idx[r0 + (r < MR ? r : MR - 1)], arow[r] = a.q + rid[r] * Kp;
      const int8x16_t table = vld1q_s8(w.codebook);
      float32x4_t accf[RP][CP];
      for (int p = 0; p < RP; ++p)
        for (int q = 0; q < CP; ++q) accf[p][q] = vdupq_n_f32(0.f);
      const ScaleIndex sx(w, e, b);
      const int64_t NP = kBlk ? a.NP : 1, pl = NP > 1 ? a.pk : Kp;  // A8 blocks shorter than a group: pieces
      for (int64_t gi = 0; gi < G; ++gi) {
       const int64_t g0 = gi * gl, g1 = gi == G - 1 ? Kp : (gi + 1) * gl;
       for (int64_t pi = 0; pi < NP; ++pi) {
        // 8-k chunks of this piece: k in [k0, k1)
        const int64_t k0 = g0 + pi * pl, k1 = pi == NP - 1 ? g1 : k0 + pl, ai = gi * NP + pi;
        int32x4_t acc[RP][CP];
        for (int p = 0; p < RP; ++p)
          for (int q = 0; q < CP; ++q) acc[p][q] = vdupq_n_s32(0);
        for (int64_t k = k0; k < k1; k += 8) {
          int8x16_t av[RP];
          for (int p = 0; p < RP; ++p) av[p] = vcombine_s8(act8(arow[2 * p], k, Kp), act8(arow[2 * p + 1], k, Kp));
          for (int v = 0; v < 4 * NJ; ++v) {  // 16-byte panel quarter: 4 columns
            int8x16_t lo, hi;   // the columns' k..k+3 and k+4..k+7 bytes
            if constexpr (kInt4) {
              const uint8x16_t raw = vld1q_u8(panel[v / 4] + (k / 8) * 64 + (v % 4) * 16);
              lo = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f)));
              hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
              if constexpr (kTbl) lo = vqtbl1q_s8(table, vreinterpretq_u8_s8(lo)), hi = vqtbl1q_s8(table, vreinterpretq_u8_s8(hi));
            } else {
              const uint8_t* p0 = panel[v / 4] + (k / 4) * 64 + (v % 4) * 16;
              lo = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p0), vdupq_n_u8(0x80)));
              hi = k + 4 < Kp ? vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p0 + 64), vdupq_n_u8(0x80))) : vdupq_n_s8(0);
            }
            const int8x16_t b01 = vreinterpretq_s8_s32(vzip1q_s32(vreinterpretq_s32_s8(lo), vreinterpretq_s32_s8(hi)));
            const int8x16_t b23 = vreinterpretq_s8_s32(vzip2q_s32(vreinterpretq_s32_s8(lo), vreinterpretq_s32_s8(hi)));
            for (int p = 0; p < RP; ++p) {
              acc[p][2 * v] = vmmlaq_s32(acc[p][2 * v], av[p], b01);
              acc[p][2 * v + 1] = vmmlaq_s32(acc[p][2 * v + 1], av[p], b23);
            }
          }
        }
        for (int q = 0; q < CP; ++q) {  // column pair q: columns 2q, 2q+1 of the NJ blocks
          const int64_t si0 = sx((2 * q) / 16, gi) + (2 * q) % 16, si1 = sx((2 * q + 1) / 16, gi) + (2 * q + 1) % 16;
          // (the widened forms, int_neon_forms.h: blk_scales / blk_mins [block][G][16] from block wpanel_b)
          const int64_t bi0 = ((b + (2 * q) / 16 - a.wpanel_b) * G + gi) * 16 + (2 * q) % 16, bi1 = bi0 + 1;
          const float* sc = a.blk_scales ? a.blk_scales : w.scales.as<float>();
          const int64_t ti0 = a.blk_scales ? bi0 : si0, ti1 = a.blk_scales ? bi1 : si1;
          const float s2[4] = {sc[ti0], sc[ti1], sc[ti0], sc[ti1]};
          const float32x4_t sv = vld1q_f32(s2);
          int32_t z0 = kInt4 && !kTbl ? w.code_zero : 0, z1 = z0;
          const float* mn = a.blk_mins ? a.blk_mins : w.mins.as<float>();
          const int64_t mi0 = a.blk_mins ? bi0 : si0, mi1 = a.blk_mins ? bi1 : si1;
          const float m0 = w.has_mins ? mn[mi0] : 0.f;
          const float m1 = w.has_mins ? mn[mi1] : 0.f;
          if (kInt4 && w.has_zeros) z0 = w.zeros.data()[si0], z1 = w.zeros.data()[si1];
          for (int p = 0; p < RP; ++p) {
            const int64_t i0 = rid[2 * p] * G * NP + ai, i1 = rid[2 * p + 1] * G * NP + ai;
            const int32_t s0 = a.asum[i0], s1 = a.asum[i1];
            const int32_t corr[4] = {z0 * s0, z1 * s0, z0 * s1, z1 * s1};
            float32x4_t exact = vcvtq_f32_s32(vsubq_s32(acc[p][q], vld1q_s32(corr)));
            if constexpr (kBlk) {
              const float bs[4] = {a.bscale[i0], a.bscale[i0], a.bscale[i1], a.bscale[i1]};
              exact = vmulq_f32(exact, vld1q_f32(bs));
            }
            accf[p][q] = vfmaq_f32(accf[p][q], exact, sv);
            if (w.has_mins && pi == NP - 1) {
              const float f0 = a.asum_f32[rid[2 * p] * G + gi], f1 = a.asum_f32[rid[2 * p + 1] * G + gi];
              const float ms[4] = {m0 * f0, m1 * f0, m0 * f1, m1 * f1};
              accf[p][q] = vsubq_f32(accf[p][q], vld1q_f32(ms));
            }
          }
        }
       }
      }
      for (int p = 0; p < RP; ++p)
        for (int q = 0; q < CP; ++q) {
          float t[4];
          vst1q_f32(t, accf[p][q]);
          const int64_t col = 2 * q, blk = col / 16, valid = valid_cols(w, b + blk);
          for (int half = 0; half < 2; ++half) {
            const int r = 2 * p + half;
            if (r >= MR) continue;
            const float rs = a.scale[rid[r]];
            for (int i = 0; i < 2; ++i)
              if ((col % 16) + i < valid) c[(r0 + r) * ldc + col + i] = t[2 * half + i] * rs;
          }
        }
    }
  };
};

MOE_ISA_END
