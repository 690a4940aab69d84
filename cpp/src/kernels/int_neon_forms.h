// int_neon_forms.h — the NEON int4 and int8 kernels (w4a8 / w8a8_neon_dotprod, _neon_i8mm) on the compact forms the
// x86 tiers read: split 2- to 6-bit codes (int8; moe/split_codes.h) and integer, 4-bit or fp16 scales and mins
// (moe/int_forms.h), so that the weights take the file's bytes (GGUF Q2_K, Q3_K, Q5_K, Q6_K and TQ1_0 / TQ2_0 codes,
// the K-quants' and IQ4_XS' integer scales and mins, Q4_0 / Q8_0's fp16 d). Per call, each pair of column blocks is
// widened into a per-thread scratch: int8 panels of the bytes w + 128 (split codes), and fp32
// scales and mins [block][G][16] (ActRows::wpanels, blk_scales, blk_mins, from block wpanel_b). Those are the
// values the int8 panels and fp32 forms hold (scale() and min(): exact products), which the kernel's tiles then
// read, so the bits are those of the int8 panels and fp32 forms.
// Needs: AdvSIMD (included from the NEON kernels' ISA regions).
#pragma once
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/isa.h"
#include "kernels/tile_driver.h"
#include "moe/int_forms.h"
#include "moe/split_codes.h"

MOE_ISA_BEGIN

// x >> s per byte (s in [0, 8)).
inline uint8x16_t shr_u8(uint8x16_t x, int s) { return vshlq_u8(x, vdupq_n_s8(int8_t(-s))); }

// Split codes of panel (e, b) as an int8 panel of u = w + 128: int8 steps 2t (k0 .. k0 + 3) and 2t + 1 (k0 + 4 ..
// k0 + 7) from the codes of 8-k step t.
inline void neon_widen_split(const PackedExperts& w, int64_t e, int64_t b, int64_t Kp, uint8_t* out) {
  const int bits = w.split_bits, lb = split_lb(bits), xb = split_xb(bits);
  const uint8_t* low = w.panel(e, b);
  const uint8_t* high = w.qhigh.data() + (e * w.num_blocks() + b) * split_high_bytes(Kp, bits);
  const uint8x16_t lmask = vdupq_n_u8(uint8_t((1 << lb) - 1)), xmask = vdupq_n_u8(uint8_t((1 << xb) - 1));
  const uint8x16_t shift = vdupq_n_u8(uint8_t(128 - w.split_zero));  // u = q - split_zero + 128
  for (int64_t t = 0; t < Kp / 8; ++t)
    for (int hi = 0; hi < 2; ++hi) {
      const SplitPos l = split_low_pos(bits, t, hi);
      const SplitPos h = xb ? split_high_pos(bits, t, hi) : SplitPos{0, 0};
      for (int j = 0; j < 4; ++j) {
        uint8x16_t q = vandq_u8(shr_u8(vld1q_u8(low + l.vec + 16 * j), l.bit), lmask);
        if (xb) q = vorrq_u8(q, vshlq_u8(vandq_u8(shr_u8(vld1q_u8(high + h.vec + 16 * j), h.bit), xmask), vdupq_n_s8(int8_t(lb))));
        vst1q_u8(out + (2 * t + hi) * 64 + 16 * j, vaddq_u8(q, shift));
      }
    }
}

// 16 fp16 values at p as fp32, times 16 integers (4 vectors each).
inline void neon_half_times(const uint16_t* p, const int32x4_t* iv, float* out) {
  for (int i = 0; i < 4; ++i) {
    const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)));
    vst1q_f32(out + 4 * i, vmulq_f32(d, vcvtq_f32_s32(iv[i])));
  }
}
// 16 int8 (or uint8 when !kSigned) as 4 int32 vectors.
template <bool kSigned>
inline void neon_widen16(uint8x16_t v, int32x4_t* iv) {
  int16x8_t h[2];
  if constexpr (kSigned) {
    h[0] = vmovl_s8(vget_low_s8(vreinterpretq_s8_u8(v))), h[1] = vmovl_s8(vget_high_s8(vreinterpretq_s8_u8(v)));
  } else {
    h[0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(v))), h[1] = vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(v)));
  }
  for (int i = 0; i < 2; ++i) iv[2 * i] = vmovl_s16(vget_low_s16(h[i])), iv[2 * i + 1] = vmovl_s16(vget_high_s16(h[i]));
}

// The fp32 scales [G][16] of column block (e, b) from its integer (or 4-bit) or fp16 form: scale(e, n, gi).
inline void neon_block_scales(const PackedExperts& w, int64_t e, int64_t b, int64_t G, float* out) {
  const int64_t eb = e * w.num_blocks() + b, runs = int_form_runs(G);
  int32x4_t iv[4];
  for (int64_t gi = 0; gi < G; ++gi) {
    float* o = out + gi * 16;
    if (w.iscale_groups && w.int_nibbles) {
      const uint8_t* v = w.iscales.as<uint8_t>() + nibble_block(eb, runs * (kIMinRun / 2)) + (gi / 2) * 16;
      neon_widen16<false>(vandq_u8(shr_u8(vld1q_u8(v), int(4 * (gi % 2))), vdupq_n_u8(15)), iv);
      neon_half_times(w.dscales.as<uint16_t>() + nibble_d_block(eb, int_nibble_spans(G)) + (gi / kNibbleSpan) * 16, iv, o);
    } else if (w.iscale_groups) {
      neon_widen16<true>(vld1q_u8(w.iscales.as<uint8_t>() + iscale_block(eb, runs) + gi * 16), iv);
      neon_half_times(w.dscales.as<uint16_t>() + int_d_block(eb, runs) + (gi / kIMinRun) * 16, iv, o);
    } else {  // fp16 scales, in the fp32 ones' order
      const uint16_t* p = w.scales.as<uint16_t>() + (eb * G + gi) * 16;
      for (int i = 0; i < 4; ++i) vst1q_f32(o + 4 * i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i))));
    }
  }
}
// The fp32 mins [G][16] of column block (e, b) from their integer (or 4-bit) form: min(e, n, gi).
inline void neon_block_mins(const PackedExperts& w, int64_t e, int64_t b, int64_t G, float* out) {
  const int64_t eb = e * w.num_blocks() + b, runs = int_form_runs(G), pairs = runs * (kIMinRun / 2);
  int32x4_t iv[4];
  for (int64_t gi = 0; gi < G; ++gi) {
    if (w.int_nibbles) {
      const uint8_t* v = w.imins.as<uint8_t>() + nibble_block(eb, pairs) + (gi / 2) * 16;
      neon_widen16<false>(vandq_u8(shr_u8(vld1q_u8(v), int(4 * (gi % 2))), vdupq_n_u8(15)), iv);
      neon_half_times(w.dmins.as<uint16_t>() + nibble_d_block(eb, int_nibble_spans(G)) + (gi / kNibbleSpan) * 16, iv, out + gi * 16);
    } else {  // int8 pairs: group 2p at even bytes, 2p + 1 at odd ones
      const uint8x16x2_t v = vld2q_u8(w.imins.as<uint8_t>() + imin_block(eb, pairs) + (gi / 2) * 32);
      neon_widen16<true>(v.val[gi % 2], iv);
      neon_half_times(w.dmins.as<uint16_t>() + int_d_block(eb, runs) + (gi / kIMinRun) * 16, iv, out + gi * 16);
    }
  }
}

// The int4 or int8 GEMM of a NEON kernel family Kern (tile_driver.h's int4_forms_gemm / int8_forms_gemm) on any of
// those forms: two column blocks at a time widened, as decode takes two panels a tile.
template <bool kInt4, template <bool, bool, bool> class Kern, int MR, int NJ, int ND>
void forms_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if constexpr (kInt4) int4_forms_gemm<Kern, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  else int8_forms_gemm<Kern, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}
template <bool kInt4, template <bool, bool, bool> class Kern, int MR, int NJ, int ND>
void int_neon_compact_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                           int64_t ldc) {
  const bool split = w.split_bits != 0, sc = w.iscale_groups || w.half_scales, mn = w.has_mins && w.imin_groups;
  if (!split && !sc && !mn) return forms_gemm<kInt4, Kern, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  constexpr int64_t kW = 2;
  const int64_t G = w.num_groups(), Kp = a.Kp, pb = split ? Kp * 16 : 0, fb = G * 16;
  thread_local std::vector<float> buf;  // floats: 64-byte aligned below
  buf.resize(size_t(kW * (pb / 4 + (sc ? fb : 0) + (mn ? fb : 0)) + 16));
  float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  uint8_t* pan = reinterpret_cast<uint8_t*>(base);
  float* bs = base + kW * pb / 4;
  float* bm = bs + (sc ? kW * fb : 0);
  ActRows ab = a;
  ab.wpanels = split ? pan : nullptr, ab.blk_scales = sc ? bs : nullptr, ab.blk_mins = mn ? bm : nullptr;
  for (int64_t b = b0; b < b1; b += kW) {
    const int64_t nb = std::min(kW, b1 - b);
    for (int64_t j = 0; j < nb; ++j) {
      if (split) neon_widen_split(w, e, b + j, Kp, pan + j * pb);
      if (sc) neon_block_scales(w, e, b + j, G, bs + j * fb);
      if (mn) neon_block_mins(w, e, b + j, G, bm + j * fb);
    }
    ab.wpanel_b = b;
    forms_gemm<kInt4, Kern, MR, NJ, ND>(w, e, b, b + nb, ab, c + (b - b0) * 16, ldc);
  }
}

MOE_ISA_END
