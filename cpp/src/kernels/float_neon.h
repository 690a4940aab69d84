// float_neon.h — the shared microkernel of bf16_neon / fp8w_neon (weights widened to fp32 in
// registers, fp32 FMA against duplicated activations: plain AdvSIMD, any AArch64 CPU) and of
// bf16_neon_bf16 / fp8w_neon_bf16 (kBfdot: BFDOT on bf16 pairs, fp8 decoded to bf16 first).
// A panel row holds 16 columns x 2 k; each column's (k, k+1) pair sits in one 32-bit lane:
//   bf16: k is lane << 16, k+1 is lane & 0xffff0000;
//   fp8: codes widened to 32-bit lanes, decoded (normal: exponent + 120, mantissa moved up;
//        subnormal: m * 2^-9), then even / odd lanes split with UZP. K-block sums are scaled per column.
#pragma once
#include <arm_neon.h>

#include <cstring>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// 4 e4m3fn codes in 32-bit lanes -> their float values, exact.
inline float32x4_t e4m3_lanes_to_f32(uint32x4_t c) {
  const uint32x4_t mag = vandq_u32(c, vdupq_n_u32(0x7f));
  const uint32x4_t sign = vshlq_n_u32(vandq_u32(c, vdupq_n_u32(0x80)), 24);
  const uint32x4_t normal = vorrq_u32(vaddq_u32(vshlq_n_u32(mag, 20), vdupq_n_u32(120u << 23)), sign);
  const float32x4_t sub = vmulq_n_f32(vcvtq_f32_u32(mag), 1.f / 512.f);
  const uint32x4_t sub_signed = vorrq_u32(vreinterpretq_u32_f32(sub), sign);
  return vreinterpretq_f32_u32(vbslq_u32(vcltq_u32(mag, vdupq_n_u32(8)), sub_signed, normal));
}

// 8 e4m3fn codes (widened to u16) -> bf16 bits, exact: normal codes get exponent + 120 and the
// mantissa moved up; subnormal codes (exponent field 0) come from byte tables of m * 2^-9.
inline uint16x8_t e4m3_to_bf16_bits(uint16x8_t c) {
  const uint16x8_t mag = vandq_u16(c, vdupq_n_u16(0x7f));
  const uint16x8_t normal = vaddq_u16(vshlq_n_u16(mag, 4), vdupq_n_u16(0x3c00));
  static const uint8_t kLo[16] = {0, 0, 0x80, 0xc0, 0, 0x20, 0x40, 0x60};
  static const uint8_t kHi[16] = {0, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c};
  const uint8x16_t idx = vreinterpretq_u8_u16(vorrq_u16(vandq_u16(mag, vdupq_n_u16(7)), vdupq_n_u16(0xff00)));
  const uint16x8_t lo = vreinterpretq_u16_u8(vqtbl1q_u8(vld1q_u8(kLo), idx));
  const uint16x8_t hi = vreinterpretq_u16_u8(vqtbl1q_u8(vld1q_u8(kHi), idx));
  const uint16x8_t sub = vorrq_u16(lo, vshlq_n_u16(hi, 8));
  const uint16x8_t bf = vbslq_u16(vcltq_u16(mag, vdupq_n_u16(8)), sub, normal);
  return vorrq_u16(bf, vshlq_n_u16(vandq_u16(c, vdupq_n_u16(0x80)), 8));
}


// kBfdot (neon_bf16 files only): each 32-bit lane holds one column's (k, k+1) bf16 pair, so one
// vbfdotq_f32 against the activation pair duplicated to every lane adds both products.
template <bool kFp8, bool kBfdot = false>
struct FloatNeon {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      constexpr int V = 4 * NJ;  // 4-column vectors
      const int64_t G = kFp8 ? w.num_groups() : 1, gl = w.group_len(), Kp = a.Kp;
      const uint8_t* panel[NJ];
      for (int j = 0; j < NJ; ++j) panel[j] = w.panel(e, b + j);
      const uint16_t* arow[MR];
      for (int r = 0; r < MR; ++r) arow[r] = a.bf16 + a.row_idx[r0 + r] * Kp;
      float32x4_t accf[MR][V];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < V; ++v) accf[r][v] = vdupq_n_f32(0.f);
      const ScaleIndex sx(w, e, b);
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t s0 = gi * gl / 2, s1 = gi == G - 1 ? Kp / 2 : (gi + 1) * gl / 2;
        float32x4_t acc[MR][V];
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < V; ++v) acc[r][v] = vdupq_n_f32(0.f);
        for (int64_t t = s0; t < s1; ++t) {
          if constexpr (kBfdot) {
            bfloat16x8_t av[MR];
            for (int r = 0; r < MR; ++r) {
              uint32_t pair;
              std::memcpy(&pair, arow[r] + 2 * t, 4);
              av[r] = vreinterpretq_bf16_u32(vdupq_n_u32(pair));
            }
            for (int v = 0; v < V; ++v) {
              uint16x8_t bits;
              if constexpr (kFp8) bits = e4m3_to_bf16_bits(vmovl_u8(vld1_u8(panel[v / 4] + t * 32 + (v % 4) * 8)));
              else bits = vld1q_u16(reinterpret_cast<const uint16_t*>(panel[v / 4] + t * 64 + (v % 4) * 16));
              const bfloat16x8_t wv = vreinterpretq_bf16_u16(bits);
              for (int r = 0; r < MR; ++r) acc[r][v] = vbfdotq_f32(acc[r][v], wv, av[r]);
            }
            continue;
          }
          float32x4_t a0[MR], a1[MR];
          for (int r = 0; r < MR; ++r) {
            uint32_t pair;
            std::memcpy(&pair, arow[r] + 2 * t, 4);
            a0[r] = vreinterpretq_f32_u32(vdupq_n_u32(pair << 16));
            a1[r] = vreinterpretq_f32_u32(vdupq_n_u32(pair & 0xffff0000u));
          }
          for (int v = 0; v < V; ++v) {
            float32x4_t w0, w1;
            if constexpr (kFp8) {  // 8 codes: columns 4v'..4v'+3, k and k+1 interleaved
              const uint8x8_t codes = vld1_u8(panel[v / 4] + t * 32 + (v % 4) * 8);
              const uint16x8_t c16 = vmovl_u8(codes);
              const float32x4_t f0 = e4m3_lanes_to_f32(vmovl_u16(vget_low_u16(c16)));
              const float32x4_t f1 = e4m3_lanes_to_f32(vmovl_u16(vget_high_u16(c16)));
              w0 = vuzp1q_f32(f0, f1), w1 = vuzp2q_f32(f0, f1);
            } else {
              const uint32x4_t pairs = vld1q_u32(reinterpret_cast<const uint32_t*>(panel[v / 4] + t * 64 + (v % 4) * 16));
              w0 = vreinterpretq_f32_u32(vshlq_n_u32(pairs, 16));
              w1 = vreinterpretq_f32_u32(vandq_u32(pairs, vdupq_n_u32(0xffff0000u)));
            }
            for (int r = 0; r < MR; ++r) acc[r][v] = vfmaq_f32(vfmaq_f32(acc[r][v], w0, a0[r]), w1, a1[r]);
          }
        }
        for (int v = 0; v < V; ++v) {
          const float32x4_t sv = kFp8 ? vld1q_f32(w.scales.as<float>() + sx(v / 4, gi) + (v % 4) * 4)
                                      : vdupq_n_f32(1.f);
          for (int r = 0; r < MR; ++r) accf[r][v] = vfmaq_f32(accf[r][v], acc[r][v], sv);
        }
      }
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < V; ++v) {
          const int n0 = (v % 4) * 4, valid = valid_cols(w, b + v / 4) - n0;
          float tmp[4];
          vst1q_f32(tmp, accf[r][v]);
          if (valid > 0) std::memcpy(c + (r0 + r) * ldc + (v / 4) * 16 + n0, tmp, size_t(valid < 4 ? valid : 4) * 4);
        }
    }
  };
};

MOE_ISA_END
