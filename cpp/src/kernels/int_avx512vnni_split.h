// int_avx512vnni_split.h — w8a8_avx512vnni on split 2- to 6-bit codes (PackedExperts::split_bits, layout in
// moe/split_codes.h; GGUF Q2_K, Q3_K and Q6_K in groups of 16, Q5_K in groups of 32), so that decode reads the file's
// bits. Decode (one row) streams a panel's low bits and high bits a group at a time: per 8-k step one 64-byte vector
// of low bits gives two steps of 4 k (shift + AND), the high bits ORed in at [lb, lb + xb) by one vpternlogd each, so
// q = w + split_zero in [0, 64) meets the row's activation bytes in vpdpbusd; the group's int32 sum, minus
// split_zero times its code sum, is the int8 panels' exact sum, finished by IntVnni's own epilogue (the same bits).
// Row tiles (two rows or more) widen each column group's panels once per call into int8 panels of the bytes q
// (ActRows::wpanels; zero point split_zero) in a per-thread scratch, which the int8 row tiles then read from L2.
// Needs: AVX512F, AVX512BW, AVX512VNNI.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/int_avx512vnni.h"
#include "kernels/isa.h"
#include "moe/split_codes.h"

MOE_ISA_BEGIN

// f(std::integral_constant<int, I>) for I = 0 .. N - 1.
template <int N, int I = 0, class F>
inline __attribute__((always_inline)) void unroll_n(const F& f) {
  if constexpr (I < N) {
    f(std::integral_constant<int, I>{});
    unroll_n<N, I + 1>(f);
  }
}

template <int kBits, int kS>
struct SplitVnni {
  static constexpr int kLb = kBits <= 3 ? 2 : 4, kXb = kBits - kLb;
  static constexpr int kLowSpv = 4 / kLb, kSpv = kXb ? 4 / kXb : 1;  // steps per 64-byte vector of each plane
  static_assert(kS % kLowSpv == 0 && (kS % kSpv == 0 || kSpv % kS == 0), "whole groups per vector");

  // v shifted left by s bits (right for s < 0) in 16-bit lanes.
  template <int s>
  static __attribute__((always_inline)) __m512i shift16(__m512i v) {
    if constexpr (s > 0) return _mm512_slli_epi16(v, s);
    else if constexpr (s < 0) return _mm512_srli_epi16(v, -s);
    else return v;
  }
  // q of step t (kQ = t's place in its group): lo (k0 .. k0 + 3) and hi (k0 + 4 .. k0 + 7) of 16 columns; hs: the
  // left shift of the high bits that puts a group at its vector's first steps (3-bit codes in groups of 16).
  template <int kQ>
  static __attribute__((always_inline)) void codes(const uint8_t* low, const uint8_t* high, int64_t t, __m128i hs,
                                                   __m512i& lo, __m512i& hi) {
    const __m512i v = _mm512_load_si512(low + (t / kLowSpv) * 64);
    if constexpr (kLb == 4) {
      const __m512i lmask = _mm512_set1_epi8(15), hmask = _mm512_set1_epi8(char(((1 << kXb) - 1) << 4));
      lo = _mm512_and_si512(v, lmask);
      hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lmask);
      if constexpr (kXb != 0) {  // field j = 2 (t % spv) + hi at bits [4, 4 + xb): lo | (h & hmask)
        constexpr int jh = 2 * (kQ % kSpv);
        const __m512i hv = _mm512_load_si512(high + (t / kSpv) * 64);
        lo = _mm512_ternarylogic_epi32(lo, shift16<4 - kXb * jh>(hv), hmask, 0xf8);
        hi = _mm512_ternarylogic_epi32(hi, shift16<4 - kXb * (jh + 1)>(hv), hmask, 0xf8);
      }
      return;
    }
    __m512i u = shift16<-2 * (kQ % 2)>(v);  // the step's codes at bits [0, 2) and [4, 6)
    if constexpr (kXb != 0) {               // 3 bits: theirs at (t + 2) % 4 and + 4, brought to bits 2 and 6
      __m512i hv = _mm512_load_si512(high + (t / kSpv) * 64);
      if constexpr (kS < kSpv) hv = _mm512_sll_epi16(hv, hs);
      constexpr int sh = 2 - (kQ % 4 + 2) % 4;
      u = _mm512_ternarylogic_epi32(u, shift16<sh>(hv), _mm512_set1_epi8(0x33), 0xe4);  // 0x33 bits of u, others hv's
    }
    const __m512i m = _mm512_set1_epi8(char(kXb ? 7 : 3));
    lo = _mm512_and_si512(u, m);
    hi = _mm512_and_si512(_mm512_srli_epi16(u, 4), m);
  }
  // f(t, lo, hi) for the codes of one group's kS steps from step s0, each plane prefetched kDecodePrefetchBytes of
  // codes ahead.
  template <class F>
  static __attribute__((always_inline)) void group_codes(const uint8_t* low, const uint8_t* high, int64_t s0, const F& f) {
    static_assert(kS >= kSpv || (kBits == 3 && kS == 2), "short groups: 3-bit codes in groups of 16");
    const __m128i hs = _mm_cvtsi32_si128(kS < kSpv ? int(s0 % kSpv) : 0);  // 2 for a group at steps 2 and 3
    unroll_n<kS>([&](auto qc) __attribute__((always_inline)) {
      constexpr int q = decltype(qc)::value;
      const int64_t t = s0 + q;
      if constexpr (q % kLowSpv == 0) _mm_prefetch((const char*)(low + (t / kLowSpv) * 64 + kDecodePrefetchBytes * kLb / 4), _MM_HINT_T1);
      if constexpr (kXb != 0 && q % kSpv == 0)
        _mm_prefetch((const char*)(high + (t / kSpv) * 64 + kDecodePrefetchBytes * kXb / 4), _MM_HINT_T1);
      __m512i lo, hi;
      codes<q>(low, high, t, hs, lo, hi);
      f(t, lo, hi);
    });
  }
  // Decode: one group against the row's codes y, into two int32 chains.
  static __attribute__((always_inline)) void group(const uint8_t* low, const uint8_t* high, const int8_t* y, int64_t s0,
                                                   __m512i& acc_lo, __m512i& acc_hi) {
    group_codes(low, high, s0, [&](int64_t t, __m512i lo, __m512i hi) __attribute__((always_inline)) {
      dpbusd_bcast(acc_lo, lo, y + t * 8);
      dpbusd_bcast(acc_hi, hi, y + t * 8 + 4);
    });
  }
  // The codes q as bytes in the int8 panel layout (steps 2t and 2t + 1) of one panel's `steps` 8-k steps (the
  // prefetch runs into the next panel's, which the next call widens).
  // far: the next column group's high bits, prefetched at the same place (read after this group's row tiles).
  static void widen(const uint8_t* low, const uint8_t* high, int64_t steps, uint8_t* out, int64_t far) {
    for (int64_t s0 = 0; s0 < steps; s0 += kS) {
      if constexpr (kXb != 0)
        if (s0 % kSpv == 0) _mm_prefetch((const char*)(high + (s0 / kSpv) * 64 + far), _MM_HINT_T1);
      group_codes(low, high, s0, [&](int64_t t, __m512i lo, __m512i hi) __attribute__((always_inline)) {
        _mm512_store_si512(out + 2 * t * 64, lo);
        _mm512_store_si512(out + (2 * t + 1) * 64, hi);
      });
    }
  }
};

// Decode: one panel at a time (ND = 1), with the weights' offset form fixed at compile time.
template <int kBits, int kS, int kBlk>
void split_vnni_decode(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const auto each = [&](auto micro) {
    for (int64_t b = b0; b < b1; ++b) decltype(micro)::run(w, e, b, a, 0, c + (b - b0) * 16, ldc);
  };
  if (w.has_mins && w.imin_groups)
    each(typename IntVnni<false, false, Offset::kIntMins, false, kBlk, kBits, kS>::template Micro<1, 1>{});
  else if (w.has_mins) each(typename IntVnni<false, false, Offset::kMins, false, kBlk, kBits, kS>::template Micro<1, 1>{});
  else each(typename IntVnni<false, false, Offset::kImplicit, false, kBlk, kBits, kS>::template Micro<1, 1>{});
}

template <int kBits, int kS>
void split_vnni_widen(const PackedExperts& w, int64_t e, int64_t b, int64_t Kp, uint8_t* out, int64_t next) {
  const uint8_t* high = w.qhigh.data() + (e * w.num_blocks() + b) * split_high_bytes(Kp, kBits);
  SplitVnni<kBits, kS>::widen(w.panel(e, b), high, Kp / 8, out, next * split_high_bytes(Kp, kBits));
}

// Row tiles: per group of NJ column blocks, their panels widened into int8 panels (and, with integer scales, their
// fp32 scales built: with_block_scales) once for all the expert's rows.
template <int kBits, int kS, int MR, int NJ, int ND>
void split_vnni_tiles(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const int64_t G = a.G, Kp = a.Kp, pb = Kp * 16;
  thread_local std::vector<uint8_t> buf;
  const size_t scale_bytes = w.iscale_groups ? size_t(NJ * G * 16) * sizeof(float) : 0;
  buf.resize(size_t(NJ * pb) + scale_bytes + 128);
  uint8_t* pan = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  float* blk = w.iscale_groups ? reinterpret_cast<float*>(pan + NJ * pb) : nullptr;
  ActRows ab = a;
  ab.wpanels = pan, ab.blk_scales = blk;
  for (int64_t b = b0; b < b1; b += NJ) {
    const int64_t nj = std::min<int64_t>(NJ, b1 - b);
    // the next group's high bits and integer scales prefetched as this one's are read: DRAM streams them while the
    // row tiles compute (Zen 4, M = 128: the widening's loads of them had held a third of its samples)
    const int64_t next = b + NJ < b1 ? std::min<int64_t>(NJ, b1 - b - NJ) : 0;
    for (int64_t j = 0; j < nj; ++j) split_vnni_widen<kBits, kS>(w, e, b + j, Kp, pan + j * pb, next ? NJ : 0);
    if (blk) {
      const IntFormBlock forms(w, e, b, G);
      for (int64_t j = 0; j < nj; ++j)
        for (int64_t gi = 0; gi < G; ++gi) {
          if (next && j < next && !forms.nib && gi % 4 == 0) _mm_prefetch((const char*)forms.isc_at(j + NJ, gi), _MM_HINT_T1);
          _mm512_store_ps(blk + (j * G + gi) * 16, int_scale16(forms, j, gi));
        }
    }
    ab.wpanel_b = b;
    int_vnni_gemm_offset<false, false, MR, NJ, ND>(w, e, b, b + nj, ab, c + (b - b0) * 16, ldc);
  }
}

// Q2_K at its default activation blocks (one block a run of 8 groups of 16; split_zero 0): the 4-bit group scales
// inside the int32 sums, one conversion a run, as the AVX2 tier's run sums (docs/numerics.md). Decode: each pair of
// groups' int32 sums, as int16 pairs, meets the pair's scales in one vpdpwssd; row tiles: the codes widened as
// q * isc (at most 45) into int8 panels, a run one group. The same integer a run, then the same fp32 operations.
inline bool split_run_sums(const PackedExperts& w, const ActRows& a) {
  return w.split_bits == 2 && w.int_nibbles && w.imin_groups && w.split_zero == 0 && w.group_len() == 16 && a.bscale &&
         a.NP == 1 && w.act_block == kIMinRun * 16 && a.G % kIMinRun == 0;
}

// rows [r0, r0 + MR) x panels [b, b + NJ): decode (MR = NJ = 1, no a.wpanels) reads the split codes, row tiles the
// widened panels and their runs' fp32 d (a.blk_scales, [NJ][runs][16]).
template <int MR, int NJ>
struct SplitRunsMicro {
  static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c, int64_t ldc) {
    constexpr bool kDecode = MR == 1 && NJ == 1;  // with no widened panels (decode): from the split codes
    constexpr bool kShare = MR > 1 && NJ >= 2;
    const int64_t G = a.G, Kp = a.Kp, runs = G / kIMinRun;
    const IntFormBlock forms(w, e, b, G);
    const int8_t* arow[MR];
    const float* bsr[MR];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      arow[r] = a.q + a.row_idx[r0 + r] * Kp;
      bsr[r] = a.bscale + a.row_idx[r0 + r] * G;
    }
    alignas(64) float corr[MR * NJ * 16];
    int_mins_term<MR, NJ>(w, e, b, a, r0, corr);
    __m512 accf[MR][NJ];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) accf[r][j] = _mm512_setzero_ps();
    if (kDecode && !a.wpanels) {
      using S = SplitVnni<2, 2>;
      const uint8_t* low = w.panel(e, b);
      const __m512i pmask = _mm512_set1_epi32(0x000f000f), lo16 = _mm512_set1_epi32(0xffff);
      for (int64_t s = 0; s < runs; ++s) {
        _mm_prefetch((const char*)forms.nib_sc(0, (s + 2) * kIMinRun), _MM_HINT_T0);
        __m512i racc = _mm512_setzero_si512();
        unroll_n<kIMinRun / 2>([&](auto pc) __attribute__((always_inline)) {
          const int64_t g = s * kIMinRun + 2 * decltype(pc)::value;
          __m512i ev = _mm512_setzero_si512(), od = _mm512_setzero_si512();
          S::group_codes(low, nullptr, 2 * g, [&](int64_t t, __m512i lo, __m512i hi) __attribute__((always_inline)) {
            dpbusd_bcast(ev, lo, arow[0] + t * 8), dpbusd_bcast(ev, hi, arow[0] + t * 8 + 4);
          });
          S::group_codes(low, nullptr, 2 * g + 2, [&](int64_t t, __m512i lo, __m512i hi) __attribute__((always_inline)) {
            dpbusd_bcast(od, lo, arow[0] + t * 8), dpbusd_bcast(od, hi, arow[0] + t * 8 + 4);
          });
          // the pair's sums (|sum| < 2^13) as int16 pairs, and its scales (low nibble: group g) as int16 pairs
          const __m512i sums = _mm512_ternarylogic_epi32(ev, _mm512_slli_epi32(od, 16), lo16, 0xe4);
          const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(forms.nib_sc(0, g))));
          dpwssd(racc, sums, _mm512_ternarylogic_epi32(x, _mm512_slli_epi32(x, 12), pmask, 0xa8));
        });
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(racc), _mm512_set1_ps(bsr[0][s * kIMinRun]));
        accf[0][0] = _mm512_fmadd_ps(f, half16(forms.nib_d(0, s * kIMinRun)), accf[0][0]);
      }
    } else {
      const uint8_t* panel[NJ];
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) panel[j] = a.wpanels + (b + j - a.wpanel_b) * Kp * 16;
      NextGroupPrefetch<(MR * NJ + 15) / 16> pf(w, e, b, NJ, r0, MR, a.rows, Kp / 4);
      constexpr int64_t kRunSteps = kIMinRun * 16 / 4;
      for (int64_t s = 0; s < runs; ++s) {
        __m512i acc[MR][NJ];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) acc[r][j] = _mm512_setzero_si512();
        for (int64_t t0 = s * kRunSteps; t0 < (s + 1) * kRunSteps; t0 += 4) {
          pf.steps(4);
          _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) {
            const int64_t t = t0 + q;
            __m512i wv[NJ];
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) wv[j] = _mm512_load_si512(panel[j] + t * 64);
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) dpbusd_row<kShare>(acc[r], wv, arow[r] + t * 4);
          }
        }
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
          const __m512 dv = _mm512_load_ps(a.blk_scales + (j * runs + s) * 16);
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][j]), _mm512_set1_ps(bsr[r][s * kIMinRun]));
            accf[r][j] = _mm512_fmadd_ps(f, dv, accf[r][j]);
          }
        }
      }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
      const __mmask16 m = __mmask16((1u << valid_cols(w, b + j)) - 1);
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
        _mm512_mask_storeu_ps(c + (r0 + r) * ldc + 16 * j, m,
                              _mm512_mul_ps(_mm512_sub_ps(accf[r][j], _mm512_load_ps(corr + (r * NJ + j) * 16)),
                                            _mm512_set1_ps(a.scale[a.row_idx[r0 + r]])));
    }
  }
};

// Row tiles of the run sums: per group of NJ column blocks, the codes widened once as q * isc (16-bit multiplies: each
// byte's product stays in its byte) and the runs' d as fp32.
template <int MR, int NJ>
void split_runs_tiles(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  using S = SplitVnni<2, 2>;
  const int64_t G = a.G, Kp = a.Kp, pb = Kp * 16, runs = G / kIMinRun;
  thread_local std::vector<uint8_t> buf;
  buf.resize(size_t(NJ * pb) + size_t(NJ * runs * 16) * sizeof(float) + 128);
  uint8_t* pan = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  float* blk = reinterpret_cast<float*>(pan + NJ * pb);
  ActRows ab = a;
  ab.wpanels = pan, ab.blk_scales = blk;
  for (int64_t b = b0; b < b1; b += NJ) {
    const int64_t nj = std::min<int64_t>(NJ, b1 - b);
    const IntFormBlock forms(w, e, b, G);
    for (int64_t j = 0; j < nj; ++j) {
      const uint8_t* low = w.panel(e, b + j);
      uint8_t* out = pan + j * pb;
      for (int64_t g = 0; g < G; ++g) {
        const __m512i x = _mm512_cvtepu8_epi32(nibbles16(forms.nib_sc(j, g), g));
        const __m512i sc = _mm512_or_si512(x, _mm512_slli_epi32(x, 16));  // isc in both words of its column's dword
        S::group_codes(low, nullptr, 2 * g, [&](int64_t t, __m512i lo, __m512i hi) __attribute__((always_inline)) {
          _mm512_store_si512(out + 2 * t * 64, _mm512_mullo_epi16(lo, sc));
          _mm512_store_si512(out + (2 * t + 1) * 64, _mm512_mullo_epi16(hi, sc));
        });
      }
      for (int64_t s = 0; s < runs; ++s) _mm512_store_ps(blk + (j * runs + s) * 16, half16(forms.nib_d(j, s * kIMinRun)));
    }
    ab.wpanel_b = b;
    drive<SplitRunsMicro, MR, NJ, 1>(w, e, b, b + nj, ab, c + (b - b0) * 16, ldc);
  }
}

template <int kBits, int kS, int MR, int NJ, int ND>
void split_vnni_gemm_as(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if constexpr (kBits == 2)
    if (split_run_sums(w, a)) {
      if (a.rows > 1) return split_runs_tiles<MR, NJ>(w, e, b0, b1, a, c, ldc);
      for (int64_t b = b0; b < b1; ++b) SplitRunsMicro<1, 1>::run(w, e, b, a, 0, c + (b - b0) * 16, ldc);
      return;
    }
  if (a.rows > 1 || (a.bscale && a.NP > 1)) return split_vnni_tiles<kBits, kS, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  if (a.bscale) split_vnni_decode<kBits, kS, 1>(w, e, b0, b1, a, c, ldc);
  else split_vnni_decode<kBits, kS, 0>(w, e, b0, b1, a, c, ldc);
}
template <int kBits, int MR, int NJ, int ND>
void split_vnni_gemm_bits(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if (kBits == 5 || w.group_len() == 32) return split_vnni_gemm_as<kBits, 4, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  if constexpr (kBits != 5) split_vnni_gemm_as<kBits, 2, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}

// w8a8_avx512vnni's GEMM: split codes here (groups of 16 or 32: the int8 tile's half width), int8 panels in
// int_avx512vnni.h.
template <int MR, int NJ, int ND>
void int8_vnni_codes_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  switch (w.split_bits) {
    case 0: return int8_vnni_gemm<MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
    case 2: return split_vnni_gemm_bits<2, MR, NJ / 2, ND>(w, e, b0, b1, a, c, ldc);
    case 3: return split_vnni_gemm_bits<3, MR, NJ / 2, ND>(w, e, b0, b1, a, c, ldc);
    case 4: return split_vnni_gemm_bits<4, MR, NJ / 2, ND>(w, e, b0, b1, a, c, ldc);
    case 5: return split_vnni_gemm_bits<5, MR, NJ / 2, ND>(w, e, b0, b1, a, c, ldc);
    default: return split_vnni_gemm_bits<6, MR, NJ / 2, ND>(w, e, b0, b1, a, c, ldc);
  }
}

MOE_ISA_END
