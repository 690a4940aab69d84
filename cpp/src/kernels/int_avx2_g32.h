// int_avx2_g32.h — row tiles of the vpmaddubsw int kernels (w4a8_avx2, w8a8_avx2) for short scale groups,
// the GGUF forms: int4 groups of 32 (Q4_0, Q4_K, IQ4_NL / IQ4_XS) and 16 through a codebook (IQ2_XS, IQ2_S, IQ1_M,
// ik's IQ2_K / IQ3_K), int8 groups of 32 (Q8_0, Q5_0, Q5_K) and 16 (Q6_K). MR rows x 8 columns at a time, one ymm fp32 sum per row across all groups. Per
// (group, 8 columns) the codes are unpacked once and serve every row of the tile; per row and group:
//   int4 kPlain: 8 vpmaddubsw whose int16 outputs add as a tree (16 products <= 16 * 15 * 127 < 2^15), one
//     vpmaddwd, minus code_zero * the group's code sum (int32);
//   int4 kSigned, int8: vpmaddubsw(|w|, sign(a, w)) then vpmaddwd per 4 channels (2 * 128 * 127 < 2^15), in
//     passes of 16 channels (w = codebook value, or the int8 byte minus 128), each step's 4 activation bytes a
//     broadcast load (no vpshufd), added to the row's int32 sum at once (signed_row_step);
//   int4 kQword (plain codes on qword panels, moe/qword_panels.h): per 8 k one 8-byte broadcast of the activations
//     for both nibble vectors (no vpshufd), 8 vpmaddubsw into two int16 sums, one vphaddw, one vpmaddwd;
//   int4 kQwordSigned: kSigned's products on qword panels, each pass's column halves {0, 1, 4, 5} / {2, 3, 6, 7} summed
//     over both passes, then one vphaddd a group;
//   int4 kQwordTable (code_table bytes <= 64): kQwordSigned's loop on the unsigned code_table bytes, no vpsignb,
//     minus code_zero * the group's code sum, as kPlain;
// then, as IntAvx2 computes them (the same integers, the same fp32 operations in the same order; the zero point and
// the mins are compile-time terms, kF):
// converted, times the group's block scale (kBlk), fmadd with the group scale, minus min * the group's
// scaled code sum. The decode tile (one row) stays IntAvx2's.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/int_avx2.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// Groups a tile holds code_zero * code sum for on its stack.
constexpr int64_t kG32MaxGroups = 512;

// Whether IntAvx2G32 runs this GEMM's row tiles: groups of gl along all of K, activations per token or one
// block scale per group, two rows or more.
inline bool g32_fits(const PackedExperts& w, const ActRows& a, int64_t gl) {
  return w.group_len() == gl && a.Kp == a.G * gl && a.G <= kG32MaxGroups && a.rows >= 2 && (!a.bscale || a.NP == 1);
}
// int4: groups of 32, no stored zero points, codes as stored (kPlain) or through |codebook| (kSigned; a
// codebook of small codes, kTable, stays IntAvx2's); or groups of 16 through a codebook (GGUF IQ2_XS, IQ2_S, IQ1_M,
// ik's IQ2_K / IQ3_K: kSigned's tiles, one pass a group, small codes too).
inline bool int4_g32_fits(const PackedExperts& w, const ActRows& a, Codes c) {  // (declared in int_avx2.h)
  return !w.has_zeros && ((g32_fits(w, a, 32) && c != Codes::kTable) ||
                          (g32_fits(w, a, 16) && (c == Codes::kSigned || c == Codes::kTable) && !w.qword_panels));
}
// int8: groups of 16 or 32 (the passes per group, 1 or 2), else 0.
inline int int8_g32_passes(const PackedExperts& w, const ActRows& a) {  // (declared in int_avx2.h)
  return g32_fits(w, a, 16) ? 1 : g32_fits(w, a, 32) ? 2 : 0;
}

// A row tile's MR x 16 sums (out) to rows r0.. of c, the block's valid columns: vector copies for whole blocks (a
// memcpy call per row cost 1% of a prefill layer).
template <int MR>
__attribute__((always_inline)) inline void write_tile(const PackedExperts& w, int64_t b, int64_t r0, const float (*out)[16],
                                                     float* c, int64_t ldc) {
  const int valid = valid_cols(w, b);
  if (valid == 16) {
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      _mm256_storeu_ps(c + (r0 + r) * ldc, _mm256_load_ps(out[r]));
      _mm256_storeu_ps(c + (r0 + r) * ldc + 8, _mm256_load_ps(out[r] + 8));
    }
    return;
  }
  for (int r = 0; r < MR; ++r) std::memcpy(c + (r0 + r) * ldc, out[r], size_t(valid) * 4);
}

// The 8 activation bytes at p in every 8-byte lane.
inline __m256i bcast8(const int8_t* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm256_set1_epi64x(v);
}

// One row's exact int32 of a group of 32 plain codes on qword panels, 8 columns in order (moe/qword_panels.h): lo /
// hi the 4 steps' low / high nibbles (columns {0, 1, 4, 5} / {2, 3, 6, 7}), y the group's activations. Each int16
// lane of the two sums adds 8 products, the vphaddw 16 (<= 16 * 15 * 127 < 2^15).
inline __m256i qword_group(const __m256i* lo, const __m256i* hi, const int8_t* y, __m256i ones) {
  const __m256i b0 = bcast8(y), b1 = bcast8(y + 8), b2 = bcast8(y + 16), b3 = bcast8(y + 24);
  const __m256i s0 = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo[0], b0), _mm256_maddubs_epi16(lo[1], b1)),
                                      _mm256_add_epi16(_mm256_maddubs_epi16(lo[2], b2), _mm256_maddubs_epi16(lo[3], b3)));
  const __m256i s1 = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(hi[0], b0), _mm256_maddubs_epi16(hi[1], b1)),
                                      _mm256_add_epi16(_mm256_maddubs_epi16(hi[2], b2), _mm256_maddubs_epi16(hi[3], b3)));
  return _mm256_madd_epi16(_mm256_hadd_epi16(s0, s1), ones);
}

// One row's qword_group sums of both half-panels of a group of 32 plain codes at pg (activations y): sl[h] / sh[h]
// half h's s0 / s1, each step's broadcast shared by both halves (the same wrapping int16 sums, so the same int32).
__attribute__((always_inline)) inline void qword_group_halves(const uint8_t* pg, const int8_t* y, __m256i low4, __m256i* sl,
                                                              __m256i* sh) {
  _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
    const __m256i bt = bcast8(y + t * 8);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64 + h * 32));
      const __m256i x0 = _mm256_maddubs_epi16(_mm256_and_si256(v, low4), bt);
      const __m256i x1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), bt);
      sl[h] = t ? _mm256_add_epi16(sl[h], x0) : x0, sh[h] = t ? _mm256_add_epi16(sh[h], x1) : x1;
    }
  }
}

// The 4 activation bytes at p in every 4-byte lane (vpbroadcastd from memory).
inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The 16 activation bytes at p in both 128-bit lanes.
inline __m256i bcast16(const int8_t* p) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// s += the 8 columns' dot of 4 signed weight bytes (w, and |w| in aw) with the 4 activation bytes at y:
// vpmaddubsw(|w|, sign(y, w)) then vpmaddwd (2 * 128 * 127 < 2^15), added at once. Inline asm: with intrinsics the
// compiler computed a pass's products for all 8 rows first and spilled about one vector a vpmaddwd (Zen 4, paired:
// Q8_0 M = 512 0.97 of that time).
__attribute__((always_inline)) inline void signed_row_step(__m256i& s, const int8_t* y, __m256i w, __m256i aw, __m256i ones) {
  __m256i b;
  asm("vpbroadcastd %[y], %[b]\n\t"
      "vpsignb %[w], %[b], %[b]\n\t"
      "vpmaddubsw %[b], %[aw], %[b]\n\t"
      "vpmaddwd %[ones], %[b], %[b]\n\t"
      "vpaddd %[b], %[s], %[s]"
      : [s] "+x"(s), [b] "=&x"(b)
      : [y] "m"(*reinterpret_cast<const int32_t*>(y)), [w] "x"(w), [aw] "x"(aw), [ones] "x"(ones));
}

// A row tile's compile-time epilogue terms (kF): codes with a zero point (minus zc * code sum), weights with mins.
constexpr int kG32Zc = 1, kG32Mins = 2;
inline int g32_terms(int zc, bool mins) { return (zc != 0 ? kG32Zc : 0) | (mins ? kG32Mins : 0); }
// fn(std::integral_constant<int, kF>) for f's terms; kMask: the terms this form can have (no other is instantiated).
template <int kMask, class Fn>
__attribute__((always_inline)) inline void with_g32_terms(int f, const Fn& fn) {
  if ((f & ~kMask) != 0) throw std::logic_error("row tile terms outside the form's");
  switch (f) {
    case kG32Zc: if constexpr ((kMask & kG32Zc) != 0) return fn(std::integral_constant<int, kG32Zc>{}); break;
    case kG32Mins: if constexpr ((kMask & kG32Mins) != 0) return fn(std::integral_constant<int, kG32Mins>{}); break;
    case kG32Zc | kG32Mins:
      if constexpr (kMask == (kG32Zc | kG32Mins)) return fn(std::integral_constant<int, kG32Zc | kG32Mins>{});
      break;
    default: return fn(std::integral_constant<int, 0>{});
  }
}

// A row tile's rows (IntAvx2G32, IntAvx2Split): each row's activation codes, block scales (kBlk), fp32 code sums
// (kF & kG32Mins) and zc * its code sum per group (kF & kG32Zc); finish() takes a group's exact int32 sums to the
// fp32 sum with IntAvx2's epilogue (minus zc * code sum, converted, times the block scale, fmadd with the group
// scale sv, minus min * the group's scaled code sum).
template <int MR, int kBlk, int kF>
struct G32Rows {
  const int8_t* arow[MR];
  const float* bsr[MR];
  const float* asf[MR];
  alignas(32) int32_t zs[(kF & kG32Zc) ? MR : 1][(kF & kG32Zc) ? kG32MaxGroups : 1];
  G32Rows(const ActRows& a, int64_t r0, int64_t G, int zc) {
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      const int64_t ri = a.row_idx[r0 + r];
      arow[r] = a.q + ri * a.Kp;
      bsr[r] = kBlk ? a.bscale + ri * G : nullptr;
      asf[r] = (kF & kG32Mins) ? a.asum_f32 + ri * G : nullptr;
      if constexpr ((kF & kG32Zc) != 0)
        for (int64_t gi = 0; gi < G; ++gi) zs[r][gi] = zc * a.asum[ri * G + gi];
    }
  }
  // mn: the mins of the group's 8 columns (kF & kG32Mins).
  __attribute__((always_inline)) __m256 finish(int r, int64_t gi, __m256i exact, __m256 sv, const float* mn, __m256 acc) const {
    if constexpr ((kF & kG32Zc) != 0) exact = _mm256_sub_epi32(exact, _mm256_set1_epi32(zs[r][gi]));
    __m256 x = _mm256_cvtepi32_ps(exact);
    if constexpr (kBlk != 0) x = _mm256_mul_ps(x, _mm256_broadcast_ss(bsr[r] + gi));
    acc = _mm256_fmadd_ps(x, sv, acc);
    if constexpr ((kF & kG32Mins) != 0) acc = _mm256_fnmadd_ps(_mm256_load_ps(mn), _mm256_broadcast_ss(asf[r] + gi), acc);
    return acc;
  }
};

// A row tile's mins of each group's 8 columns: float mins (the weights', or the block's scratch a.blk_mins), integer
// ones widened per group for all the tile's rows (where no scratch was built), or none.
struct TileMins {
  const IntForms& forms;
  const bool widen;
  const float* const mn;
  TileMins(const PackedExperts& w, const ActRows& a, const IntForms& f, int64_t sbase)
      : forms(f), widen(f.imn && !a.blk_mins),
        mn(!w.has_mins || widen ? nullptr : a.blk_mins ? a.blk_mins : w.mins.as<float>() + sbase) {}
  // Group gi's mins at columns c8..c8+7 (buf: 8 aligned floats, for widened ones), or nullptr.
  __attribute__((always_inline)) const float* at(int64_t gi, int64_t c8, float* buf) const {
    if (widen) return _mm256_store_ps(buf, forms.mins(nullptr, 0, gi, c8, nullptr, 0)), buf;
    return mn ? mn + gi * 16 + c8 : nullptr;
  }
};

// kInt4: int4 codes C in groups of 16 P (P = 1: kSigned only); else int8 in groups of 16 P. kF: g32_terms(w, C).
// kSum (kSigned, kQwordSigned, kQwordTable): vpmaddubsw outputs added in int16 before one vpmaddwd (signed_pair_sum;
// kQwordTable: 2).
template <bool kInt4, Codes C, int kBlk, int P, int kF, int kSum>
struct IntAvx2G32 {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      static_assert(NJ == 1, "one column block per row tile (drive_even)");
      const int64_t G = a.G;
      const uint8_t* panel = w.panel(e, b);
      const int64_t sbase = ScaleIndex(w, e, b, G).base;
      const float* sc = w.scales.as<float>();
      const IntForms forms(w, e, b, G);  // scales: a.blk_scales, fp16, integer or fp32, [G][16] from sbase
      const TileMins mins(w, a, forms, sbase);
      constexpr int64_t gl = 16 * P, gbytes = kInt4 ? 8 * gl : 16 * gl;  // a group's bytes in one half-panel
      constexpr bool kPlainCodes = kInt4 && (C == Codes::kPlain || C == Codes::kQword);
      const G32Rows<MR, kBlk, kF> rows(a, r0, G, (kF & kG32Zc) ? w.code_zero : 0);
      const auto& arow = rows.arow;
      const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(char(0x80));
      const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
          C == Codes::kSigned || C == Codes::kQwordSigned ? (const void*)w.codebook : (const void*)w.code_table)));
      const __m256i abs_table = _mm256_abs_epi8(table);
      NextGroupPrefetch<> pf(w, e, b, 1, r0, MR, a.rows, 2 * a.Kp / (kInt4 ? 8 : 4));
      alignas(32) float out[MR][16];
      for (int h = 0; h < 2; ++h) {
        __m256 acc[MR];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
        const uint8_t* ph = panel + h * 32;
        for (int64_t gi = 0; gi < G; ++gi) {
          pf.steps(kInt4 ? gl / 8 : gl / 4);
          const uint8_t* pg = ph + gi * gbytes;
          const __m256 sv = forms.scales(a.blk_scales, 0, gi, h * 8, sc, sbase + gi * 16 + h * 8);
          // One row's group: the exact int32 sums to the fp32 sum, as IntAvx2's epilogue.
          alignas(32) float imv[8];
          const float* mg = (kF & kG32Mins) ? mins.at(gi, h * 8, imv) : nullptr;
          const auto finish = [&](int r, __m256i exact) __attribute__((always_inline)) {
            acc[r] = rows.finish(r, gi, exact, sv, mg, acc[r]);
          };
          if constexpr (kPlainCodes) {
            __m256i lo[4], hi[4];
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
              const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64));
              lo[t] = _mm256_and_si256(v, low4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
            if constexpr (C == Codes::kQword)
              _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) finish(r, qword_group(lo, hi, arow[r] + gi * 32, ones));
            else
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
              // the group's 32 activation bytes as two 16-byte halves in both lanes; vpshufd picks each step's 4
              const __m256i yl = bcast16(arow[r] + gi * 32), yh = bcast16(arow[r] + gi * 32 + 16);
              const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[0], _mm256_shuffle_epi32(yl, 0x00)),
                                                  _mm256_maddubs_epi16(hi[0], _mm256_shuffle_epi32(yl, 0x55)));
              const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[1], _mm256_shuffle_epi32(yl, 0xaa)),
                                                  _mm256_maddubs_epi16(hi[1], _mm256_shuffle_epi32(yl, 0xff)));
              const __m256i p2 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[2], _mm256_shuffle_epi32(yh, 0x00)),
                                                  _mm256_maddubs_epi16(hi[2], _mm256_shuffle_epi32(yh, 0x55)));
              const __m256i p3 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[3], _mm256_shuffle_epi32(yh, 0xaa)),
                                                  _mm256_maddubs_epi16(hi[3], _mm256_shuffle_epi32(yh, 0xff)));
              finish(r, _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3)), ones));
            }
          } else {  // passes of 16 channels: w and |w| in 8 ymm (int4: two k-steps' codes; int8: four k-steps)
            constexpr bool kQw = C == Codes::kQwordSigned || C == Codes::kQwordTable;
            __m256i s[MR], s2[kQw ? MR : 1];
            _Pragma("GCC unroll 2") for (int p = 0; p < P; ++p) {
              __m256i sw[4], aw[4];
              if constexpr (kInt4) {
                _Pragma("GCC unroll 2") for (int t = 0; t < 2; ++t) {
                  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + (2 * p + t) * 64));
                  const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                  if constexpr (C == Codes::kQwordTable) {  // the unsigned bytes themselves
                    aw[2 * t] = _mm256_shuffle_epi8(table, lo), aw[2 * t + 1] = _mm256_shuffle_epi8(table, hi);
                    continue;
                  }
                  sw[2 * t] = _mm256_shuffle_epi8(table, lo), aw[2 * t] = _mm256_shuffle_epi8(abs_table, lo);
                  sw[2 * t + 1] = _mm256_shuffle_epi8(table, hi), aw[2 * t + 1] = _mm256_shuffle_epi8(abs_table, hi);
                }
              } else {
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
                  sw[t] = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(pg + (4 * p + t) * 64)), flip);
                  aw[t] = _mm256_abs_epi8(sw[t]);
                }
              }
              _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
                const auto m = [&](int q, __m256i yq) __attribute__((always_inline)) {
                  if constexpr (C == Codes::kQwordTable) return _mm256_maddubs_epi16(aw[q], yq);
                  else return _mm256_maddubs_epi16(aw[q], _mm256_sign_epi8(yq, sw[q]));
                };
                const auto d = [&](int q, __m256i yq) __attribute__((always_inline)) { return _mm256_madd_epi16(m(q, yq), ones); };
                const auto d2 = [&](int q0, __m256i y0, int q1, __m256i y1) __attribute__((always_inline)) {  // two, in int16 where kSum allows
                  if constexpr (kSum >= 2) return _mm256_madd_epi16(_mm256_add_epi16(m(q0, y0), m(q1, y1)), ones);
                  else return _mm256_add_epi32(d(q0, y0), d(q1, y1));
                };
                __m256i part;
                if constexpr (!kQw && kSum == 1) {  // each step added to the row's int32 sum at once (signed_row_step)
                  const int8_t* y = arow[r] + gi * gl + p * 16;
                  if (p == 0) s[r] = _mm256_setzero_si256();
                  _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) signed_row_step(s[r], y + 4 * q, sw[q], aw[q], ones);
                  if (p == P - 1) finish(r, s[r]);
                  continue;
                } else if constexpr (kQw) {  // sw / aw: step t's columns {0, 1, 4, 5} at 2t, the others at 2t + 1
                  const __m256i b0 = bcast8(arow[r] + gi * gl + p * 16), b1 = bcast8(arow[r] + gi * gl + p * 16 + 8);
                  const __m256i x0 = d2(0, b0, 2, b1), x1 = d2(1, b0, 3, b1);
                  // both passes' column halves add first, then one vphaddd a group
                  if (P == 1) finish(r, _mm256_hadd_epi32(x0, x1));
                  else if (p == 0) s[r] = x0, s2[r] = x1;
                  else finish(r, _mm256_hadd_epi32(_mm256_add_epi32(s[r], x0), _mm256_add_epi32(s2[r], x1)));
                  continue;
                } else {
                  const int8_t* y = arow[r] + gi * gl + p * 16;  // each step's 4 bytes: a broadcast load, no vpshufd
                  if constexpr (kSum == 4)
                    part = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(m(0, bcast4(y)), m(1, bcast4(y + 4))),
                                                              _mm256_add_epi16(m(2, bcast4(y + 8)), m(3, bcast4(y + 12)))), ones);
                  else
                    part = _mm256_add_epi32(d2(0, bcast4(y), 1, bcast4(y + 4)), d2(2, bcast4(y + 8), 3, bcast4(y + 12)));
                }
                if (P == 1) finish(r, part);
                else if (p == 0) s[r] = part;
                else finish(r, _mm256_add_epi32(s[r], part));
              }
            }
          }
        }
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
          _mm256_store_ps(out[r] + h * 8, _mm256_mul_ps(acc[r], _mm256_set1_ps(a.scale[a.row_idx[r0 + r]])));
      }
      write_tile<MR>(w, b, r0, out, c, ldc);
    }
  };
};

// One decode row (IntAvx2Split's and the qword decode): its activation codes, code sums, block scales (kBlk) and fp32
// code sums (weights with mins), column block b's scale forms, and IntAvx2's group epilogue and output.
template <int kBlk>
struct DecodeRow {
  const int64_t ri;
  const int8_t* y;
  const int32_t* asr;
  const float *bsr, *asf, *sc, *mins;
  const IntForms forms;
  const ScaleIndex sx;
  DecodeRow(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a)
      : ri(a.row_idx[0]), y(a.q + ri * a.Kp), asr(a.asum + ri * a.G), bsr(kBlk ? a.bscale + ri * a.G : nullptr),
        asf(w.has_mins ? a.asum_f32 + ri * a.G : nullptr), sc(w.scales.as<float>()),
        mins(w.has_mins && !w.imin_groups ? w.mins.as<float>() : nullptr), forms(w, e, b, a.G), sx(w, e, b, a.G) {}
  // acc plus group gi's exact int32 on half h: converted, times its block scale, fmadd with the group scale, and with
  // group_mins minus min * the group's scaled code sum. d / dm: the run's fp16 d / dmin, widened.
  __attribute__((always_inline)) __m256 group(int64_t gi, int h, __m256i exact, __m256 d, __m256 dm, bool group_mins,
                                              __m256 acc) const {
    const __m256 sv = forms.scales(nullptr, 0, gi, h * 8, sc, sx(0, gi) + h * 8, d);
    __m256 x = _mm256_cvtepi32_ps(exact);
    if constexpr (kBlk != 0) x = _mm256_mul_ps(x, _mm256_set1_ps(bsr[gi]));
    acc = _mm256_fmadd_ps(x, sv, acc);
    if (group_mins)
      acc = _mm256_fnmadd_ps(forms.mins(nullptr, 0, gi, h * 8, mins, sx(0, gi) + h * 8, dm), _mm256_broadcast_ss(asf + gi), acc);
    return acc;
  }
  // body(gi, d, dm) for groups [0, G) in order, d / dm: the run's fp16 d / dmin, widened once per run.
  template <class Body>
  __attribute__((always_inline)) void groups(int64_t G, const Body& body) const {
    for (int64_t g0 = 0; g0 < G; g0 += kIMinRun) {
      __m256 d[2], dm[2];
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) d[h] = forms.run_d(0, g0, h * 8), dm[h] = forms.run_dmin(0, g0, h * 8);
      for (int64_t gi = g0; gi < std::min(G, g0 + kIMinRun); ++gi) body(gi, d, dm);
    }
  }
  // (acc - corr) times the row scale, the block's valid columns to c (corr: nullptr, or the run mins term).
  void store(const PackedExperts& w, int64_t b, const ActRows& a, const __m256* acc, const float (*corr)[8], float* c) const {
    alignas(32) float out[16];
    const __m256 rs = _mm256_set1_ps(a.scale[ri]);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h)
      _mm256_store_ps(out + 8 * h, _mm256_mul_ps(corr ? _mm256_sub_ps(acc[h], _mm256_load_ps(corr[h])) : acc[h], rs));
    std::memcpy(c, out, size_t(valid_cols(w, b)) * 4);
  }
};

// One row, column block b, on qword panels (int4 codes in groups of 32, plain or kSigned): IntAvx2's decode, the
// same int32 per group and the same fp32 operations in the same order (integer mins as its run term), so the same
// bits. kSigned multiplies |activation| by the codebook value with the activation's sign (kAbsY: one vpabsb per
// step for every column instead of a |codebook| vpshufb per code vector; 2 * 127 * 127 < 2^15), or, for a codebook
// holding -128 (whose negation wraps), |codebook| by the activation with the code's sign, as the row tiles do.
template <int kBlk, bool kSigned, bool kAbsY, int kT>
void int4_qword_decode_block(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, float* c);
// Blocks [b0, b1) of one row, output block b at c + (b - b0) * 16; the codebook's form chosen once per call (and
// groups of 16, kSigned: 2 steps a group instead of 4).
template <int kBlk, bool kSigned>
void int4_qword_decode(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c) {
  const auto blocks = [&](auto abs_y) {
    if constexpr (kSigned)
      if (w.group_len() == 16) {
        for (int64_t b = b0; b < b1; ++b)
          int4_qword_decode_block<kBlk, kSigned, decltype(abs_y)::value, 2>(w, e, b, a, c + (b - b0) * 16);
        return;
      }
    for (int64_t b = b0; b < b1; ++b) int4_qword_decode_block<kBlk, kSigned, decltype(abs_y)::value, 4>(w, e, b, a, c + (b - b0) * 16);
  };
  if (kSigned && std::find(w.codebook, w.codebook + 16, int8_t(-128)) == w.codebook + 16) return blocks(std::true_type{});
  blocks(std::false_type{});
}
template <int kBlk, bool kSigned, bool kAbsY, int kT>
void int4_qword_decode_block(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, float* c) {
  static_assert(kT == 4 || (kSigned && kT == 2), "groups of 32, or of 16 through a |codebook|");
  const int64_t G = a.G;
  const uint8_t* pn = w.panel(e, b);
  const DecodeRow<kBlk> r(w, e, b, a);
  const GroupSidePrefetch side(w, r.forms, r.sx);
  alignas(32) float corr[2][8];
  const bool run_mins = w.has_mins && r.forms.imn;
  if (run_mins) {
    const bool f32_sums = kBlk != 0 && imins_f32(w);  // blocks shorter than a run
    int_mins_term_ymm<2>(r.forms, f32_sums ? nullptr : a.asum16 + r.ri * a.G2, r.bsr, f32_sums ? r.asf : nullptr, corr);
  }
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codebook)));
  const __m256i abs_table = _mm256_abs_epi8(table);
  const int zc = kSigned ? 0 : w.code_zero;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  r.groups(G, [&](int64_t gi, const __m256* run_d, const __m256* run_dm) __attribute__((always_inline)) {
      side.at<1>(gi);
      const uint8_t* pg = pn + gi * 64 * kT;
      _Pragma("GCC unroll 4") for (int t = 0; t < kT; ++t) _mm_prefetch((const char*)(pg + t * 64 + kAvx2Int4PrefetchBytes), _MM_HINT_T1);
      // Step t's activations are broadcast once for both halves (each half's sums add step by step: the same
      // wrapping sums, so the same int32 per group).
      __m256i sl[2], sh[2];
      if constexpr (kSigned) {
        _Pragma("GCC unroll 4") for (int t = 0; t < kT; ++t) {
          const __m256i bt = bcast8(r.y + gi * 8 * kT + t * 8);
          [[maybe_unused]] const __m256i at = kAbsY ? _mm256_abs_epi8(bt) : bt;
          const auto d = [&](__m256i u) __attribute__((always_inline)) {
            if constexpr (kAbsY)
              return _mm256_madd_epi16(_mm256_maddubs_epi16(at, _mm256_sign_epi8(_mm256_shuffle_epi8(table, u), bt)), ones);
            return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_shuffle_epi8(abs_table, u),
                                                          _mm256_sign_epi8(bt, _mm256_shuffle_epi8(table, u))), ones);
          };
          _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
            const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64 + h * 32));
            const __m256i x0 = d(_mm256_and_si256(v, low4)), x1 = d(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
            sl[h] = t ? _mm256_add_epi32(sl[h], x0) : x0, sh[h] = t ? _mm256_add_epi32(sh[h], x1) : x1;
          }
        }
      } else {
        qword_group_halves(pg, r.y + gi * 32, low4, sl, sh);
      }
      [[maybe_unused]] const __m256i zt = _mm256_set1_epi32(-zc * r.asr[gi]);
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
        const __m256i exact = kSigned ? _mm256_hadd_epi32(sl[h], sh[h])
                                      : _mm256_add_epi32(zt, _mm256_madd_epi16(_mm256_hadd_epi16(sl[h], sh[h]), ones));
        acc[h] = r.group(gi, h, exact, run_d[h], run_dm[h], r.asf && !run_mins, acc[h]);
      }
  });
  r.store(w, b, a, acc, run_mins ? corr : nullptr, c);
}

// drive() for row tiles of up to R rows, the rows split evenly over the fewest tiles (11 rows: 6 + 5, not 8 + 3),
// one column block at a time.
template <template <int, int> class Micro, int R>
void drive_even(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const int64_t tiles = (a.rows + R - 1) / R, base = a.rows / tiles, extra = a.rows % tiles;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t t = 0, r = 0; t < tiles; ++t) {
      const int64_t n = base + (t < extra);
      if (n == R) Micro<R, 1>::run(w, e, b, a, r, c + (b - b0) * 16, ldc);
      else tail_rows<Micro, R, 1>(n, w, e, b, a, r, c + (b - b0) * 16, ldc);
      r += n;
    }
}

// How many vpmaddubsw outputs of |codebook| x signed activations (each int16 lane two products, |activation| <=
// 127) add exactly in int16 before vpmaddwd: 4 when every |codebook value| <= 32 (8 * 32 * 127 < 2^15; IQ1_M),
// 2 when <= 64 (IQ2_XS, IQ3_K, IQ3_XXS), else 1 (IQ4_NL). The exact int32 sums do not change.
inline int signed_pair_sum(const PackedExperts& w) {
  int top = 0;
  for (int i = 0; i < 16; ++i) top = std::max(top, std::abs(int(w.codebook[i])));
  return top <= 32 ? 4 : top <= 64 ? 2 : 1;
}

// IntAvx2G32's row tiles for the weights' epilogue terms (a zero point only on plain int4 codes); signed codes at
// their int16 sums (kSum: signed_pair_sum, up to kMaxSum).
template <bool kInt4, Codes C, int kBlk, int P, int kSum = 1>
void drive_g32_as(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  constexpr bool kPlain = kInt4 && (C == Codes::kPlain || C == Codes::kQword || C == Codes::kQwordTable);
  with_g32_terms<kPlain ? kG32Zc | kG32Mins : kG32Mins>(g32_terms(kPlain ? w.code_zero : 0, w.has_mins),
                                                        [&](auto kf) __attribute__((always_inline)) {
    drive_even<IntAvx2G32<kInt4, C, kBlk, P, decltype(kf)::value, kSum>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
  });
}
template <bool kInt4, Codes C, int kBlk, int P>
void drive_g32(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if constexpr (kInt4 && C == Codes::kQwordTable) return drive_g32_as<kInt4, C, kBlk, P, 2>(w, e, b0, b1, a, c, ldc);
  if constexpr (kInt4 && (C == Codes::kSigned || C == Codes::kQwordSigned)) {
    // passes of a group of 32 add in int32; qword panels with every |value| <= 32 read as kQwordTable
    constexpr int kMaxSum = P == 1 && C == Codes::kSigned ? 4 : 2;
    const int sum = std::min(kMaxSum, signed_pair_sum(w));
    if (sum == 4) return drive_g32_as<kInt4, C, kBlk, P, kMaxSum>(w, e, b0, b1, a, c, ldc);
    if (sum == 2) return drive_g32_as<kInt4, C, kBlk, P, 2>(w, e, b0, b1, a, c, ldc);
  }
  drive_g32_as<kInt4, C, kBlk, P>(w, e, b0, b1, a, c, ldc);
}

// The int8 GEMM in IntAvx2G32's row tiles, P passes per group (int8_g32_passes).
template <int NJ, int ND>
void int8_avx2_g32_gemm(int P, const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                        int64_t ldc) {
  with_g32_terms<kG32Mins>(g32_terms(0, w.has_mins), [&](auto kf) __attribute__((always_inline)) {
    constexpr int kF = decltype(kf)::value;
    if (a.bscale)
      return P == 1 ? drive_even<IntAvx2G32<false, Codes::kPlain, 1, 1, kF>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc)
                    : drive_even<IntAvx2G32<false, Codes::kPlain, 1, 2, kF>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
    P == 1 ? drive_even<IntAvx2G32<false, Codes::kPlain, 0, 1, kF>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc)
           : drive_even<IntAvx2G32<false, Codes::kPlain, 0, 2, kF>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
  });
}

MOE_ISA_END
