// float_neon.h — the shared microkernel of bf16_neon and fp8w_neon: weights widened to fp32 in
// registers, fp32 FMA against duplicated activations (plain AdvSIMD, any AArch64 CPU).
// A panel row holds 16 columns x 2 k; each column's (k, k+1) pair sits in one 32-bit lane:
//   bf16: k is lane << 16, k+1 is lane & 0xffff0000;
//   fp8: codes widened to 32-bit lanes, decoded (normal: exponent + 120, mantissa moved up;
//        subnormal: m * 2^-9), then even / odd lanes split with UZP. K-block sums are scaled per column.
#pragma once
#include <arm_neon.h>

#include <cstring>

#include "common/layout.h"
#include "kernels/tile_driver.h"

namespace moe_cpu::kernels {

// 4 e4m3fn codes in 32-bit lanes -> their float values, exact.
inline float32x4_t e4m3_lanes_to_f32(uint32x4_t c) {
  const uint32x4_t mag = vandq_u32(c, vdupq_n_u32(0x7f));
  const uint32x4_t sign = vshlq_n_u32(vandq_u32(c, vdupq_n_u32(0x80)), 24);
  const uint32x4_t normal = vorrq_u32(vaddq_u32(vshlq_n_u32(mag, 20), vdupq_n_u32(120u << 23)), sign);
  const float32x4_t sub = vmulq_n_f32(vcvtq_f32_u32(mag), 1.f / 512.f);
  const uint32x4_t sub_signed = vorrq_u32(vreinterpretq_u32_f32(sub), sign);
  return vreinterpretq_f32_u32(vbslq_u32(vcltq_u32(mag, vdupq_n_u32(8)), sub_signed, normal));
}

template <bool kFp8>
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
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t s0 = gi * gl / 2, s1 = gi == G - 1 ? Kp / 2 : (gi + 1) * gl / 2;
        float32x4_t acc[MR][V];
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < V; ++v) acc[r][v] = vdupq_n_f32(0.f);
        for (int64_t t = s0; t < s1; ++t) {
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
          const float32x4_t sv = kFp8 ? vld1q_f32(w.scales.as<float>() + w.scale_index(e, 16 * (b + v / 4), gi) + (v % 4) * 4)
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

}  // namespace moe_cpu::kernels
