// int_avx2_split.h — the vpmaddubsw int8 kernel (w8a8_avx2) on split 2- / 4- / 5- / 6-bit codes
// (PackedExperts::split_bits, layout in moe/split_codes.h; GGUF Q2_K and Q3_K in groups of 16, Q5_K in groups of 32,
// Q6_K in groups of 16; Q3_K's 8 values take 4 bits here, as 3-bit codes' unpacking cost the row tiles 1.1-1.2x,
// KernelDesc::split3): per 8-k step one load of low bits (nibbles or a 2-bit plane) and a shift + AND of the
// high-bit vector give q = w + split_zero in [0, 63] for two steps of 4 k, and
// vpmaddubsw(q, a) + vpmaddwd sum them exactly (a step's pair <= 2 * 2 * 63 * 127 < 2^15); the group's int32 sum
// minus split_zero * its code sum is then w . a, met by the same fp32 operations as IntAvx2 / IntAvx2G32 (block
// scale, group scale, float mins), so every tier gives the same bits. Integer mins (Q5_K's dmin * 6-bit m, read as
// 2 bytes a group and 16 columns instead of 64) are widened to those same float mins per group (IntForms::mins), in
// decode and row tiles alike: the same bits as float mins. Decode (one row) streams a panel's nibbles
// and high bits one group at a time, both halves per step; row tiles (rows >= 2) are IntAvx2G32's: MR rows x 8
// columns, a group's codes unpacked once for every row.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/layout.h"
#include "kernels/int_avx2.h"
#include "kernels/int_avx2_g32.h"
#include "kernels/int_avx2_runs.h"
#include "kernels/isa.h"
#include "kernels/tile_driver.h"
#include "moe/split_codes.h"

MOE_ISA_BEGIN

// v shifted left by s bits (right for s < 0) in 16-bit lanes.
template <int s>
inline __m256i shift16(__m256i v) {
  if constexpr (s > 0) return _mm256_slli_epi16(v, s);
  else if constexpr (s < 0) return _mm256_srli_epi16(v, -s);
  else return v;
}

// f(std::integral_constant<int, 0>) ... f(std::integral_constant<int, N - 1>).
template <int N, int I = 0, class F>
inline __attribute__((always_inline)) void split_unroll(const F& f) {
  if constexpr (I < N) {
    f(std::integral_constant<int, I>{});
    split_unroll<N, I + 1>(f);
  }
}

// The codes of kBits-bit split codes (2, 4, 5, 6): lb low bits (nibbles, or a 2-bit plane) ORed with xb high bits.
template <int kBits>
struct SplitBits {
  static_assert(kBits != 3, "3-bit codes: the AVX-512 kernel's");
  static constexpr int kLb = kBits == 2 ? 2 : 4, kXb = kBits - kLb;
  static constexpr int kLowSpv = 4 / kLb, kSpv = kXb ? 4 / kXb : 1;  // steps per 64-byte vector of each plane
  // Bytes of a group of kS steps in the low bits.
  static constexpr int64_t low_bytes(int kS) { return kS / kLowSpv * 64; }
  // Bytes of a group of kS steps in the high bits.
  static constexpr int64_t high_bytes(int kS) { return kXb ? kS / kSpv * 64 : 0; }
  const __m256i lmask, hmask;
  SplitBits() : lmask(_mm256_set1_epi8(char((1 << kLb) - 1))), hmask(_mm256_set1_epi8(char(((1 << kXb) - 1) << kLb))) {}
  // Step t of a group: lo (k0 .. k0 + 3) and hi (k0 + 4 .. k0 + 7) of 8 columns, from this half's 32 bytes of the
  // group's low bits gl and high bits gh.
  template <int t>
  __attribute__((always_inline)) void at(const uint8_t* gl, const uint8_t* gh, __m256i& lo, __m256i& hi) const {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(gl + (t / kLowSpv) * 64));
    if constexpr (kLb == 4) {
      lo = _mm256_and_si256(v, lmask);
      hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lmask);
      if constexpr (kXb != 0) {  // field j = 2 (t % spv) + hi at bits [lb, lb + xb)
        constexpr int jh = 2 * (t % kSpv);
        const __m256i hv = _mm256_load_si256(reinterpret_cast<const __m256i*>(gh + (t / kSpv) * 64));
        lo = _mm256_or_si256(lo, _mm256_and_si256(shift16<kLb - kXb * jh>(hv), hmask));
        hi = _mm256_or_si256(hi, _mm256_and_si256(shift16<kLb - kXb * (jh + 1)>(hv), hmask));
      }
      return;
    }
    const __m256i u = shift16<-2 * (t % 2)>(v);  // 2 bits: the step's codes at bits [0, 2) and [4, 6)
    lo = _mm256_and_si256(u, lmask);
    hi = _mm256_and_si256(_mm256_srli_epi16(u, 4), lmask);
  }
  // Decode: both planes' vectors of group gi ~kDecodePrefetchBytes of codes ahead, into L2.
  template <int kS>
  __attribute__((always_inline)) static void prefetch(const uint8_t* gl, const uint8_t* gh) {
    _Pragma("GCC unroll 4") for (int v = 0; v < kS / kLowSpv; ++v)
      _mm_prefetch((const char*)(gl + v * 64 + kDecodePrefetchBytes * kLb / 4), _MM_HINT_T1);
    if constexpr (kXb != 0)
      _Pragma("GCC unroll 2") for (int v = 0; v < kS / kSpv; ++v)
        _mm_prefetch((const char*)(gh + v * 64 + kDecodePrefetchBytes * kXb / 4), _MM_HINT_T1);
  }
};

// The row tiles' prefetch of the next column block's high bits (kOn: codes with high bits; none without, so that
// 2- and 4-bit tiles keep their registers: a prefetch with nothing to do cost Q2_K's 1.05x).
template <bool kOn>
struct HighPrefetch : NextGroupPrefetch<> {
  using NextGroupPrefetch<>::NextGroupPrefetch;
};
template <>
struct HighPrefetch<false> {
  HighPrefetch(const uint8_t*, int64_t, bool, int64_t, int64_t, int64_t, int64_t) {}
  void steps(int64_t) {}
};

// kBits-bit codes (SplitBits), kS steps of 8 k a group (2: groups of 16, 4: of 32), kBlk: a block scale per group (A8
// activation blocks).
template <int kBits, int kBlk, int kS, int kF = 0>  // kF: the row tiles' terms (g32_terms)
struct IntAvx2Split {
  using U = SplitBits<kBits>;
  static_assert(kS % U::kSpv == 0 && kS % U::kLowSpv == 0, "whole vectors per group");

  // One row, column block b.
  static void decode(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, float* c) {
    const int64_t G = a.G;
    const uint8_t* pn = w.panel(e, b);
    const uint8_t* ph = w.qhigh.data() + (e * w.num_blocks() + b) * split_high_bytes(a.Kp, w.split_bits);
    const DecodeRow<kBlk> r(w, e, b, a);
    const int8_t* y = r.y;
    const GroupSidePrefetch side(w, r.forms, r.sx, true);
    const __m256i ones = _mm256_set1_epi16(1);
    const U u;
    const int zc = w.split_zero;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    r.groups(G, [&](int64_t gi, const __m256* run_d, const __m256* run_dm) __attribute__((always_inline)) {
      side.at<1>(gi);
      const uint8_t* gn = pn + gi * U::low_bytes(kS);
      const uint8_t* gh = ph + gi * U::high_bytes(kS);
      U::template prefetch<kS>(gn, gh);
      __m256i s32[2];
      s32[0] = s32[1] = _mm256_set1_epi32(-zc * r.asr[gi]);
      split_unroll<kS>([&](auto tc) __attribute__((always_inline)) {
        constexpr int t = decltype(tc)::value;
        const __m256i b0 = bcast4(y + (gi * kS + t) * 8), b1 = bcast4(y + (gi * kS + t) * 8 + 4);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
          __m256i lo, hi;
          u.template at<t>(gn + h * 32, gh + h * 32, lo, hi);
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, b0), _mm256_maddubs_epi16(hi, b1));
          s32[h] = _mm256_add_epi32(s32[h], _mm256_madd_epi16(p, ones));
        }
      });
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) acc[h] = r.group(gi, h, s32[h], run_d[h], run_dm[h], r.asf != nullptr, acc[h]);
    });
    r.store(w, b, a, acc, nullptr, c);
  }

  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      static_assert(NJ == 1, "one column block per row tile (drive_even)");
      const int64_t G = a.G;
      const uint8_t* pn = w.panel(e, b);
      const uint8_t* ph = w.qhigh.data() + (e * w.num_blocks() + b) * split_high_bytes(a.Kp, w.split_bits);
      const int64_t sbase = ScaleIndex(w, e, b, G).base;
      const float* sc = w.scales.as<float>();
      const IntForms forms(w, e, b, G);
      const TileMins mins(w, a, forms, sbase);  // float mins, or integer ones (Q5_K)
      const G32Rows<MR, kBlk, kF> rows(a, r0, G, w.split_zero);
      const auto& arow = rows.arow;
      const __m256i ones = _mm256_set1_epi16(1);
      const U u;
      NextGroupPrefetch<> pf(w, e, b, 1, r0, MR, a.rows, 2 * a.Kp / 8);
      HighPrefetch<U::kXb != 0> pfh(ph, split_high_bytes(a.Kp, w.split_bits), b + 2 <= w.num_blocks(), r0, MR, a.rows, 2 * a.Kp / 8);
      alignas(32) float out[MR][16];
      for (int h = 0; h < 2; ++h) {
        __m256 acc[MR];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t gi = 0; gi < G; ++gi) {
          pf.steps(kS), pfh.steps(kS);
          const uint8_t* gn = pn + gi * U::low_bytes(kS) + h * 32;
          const uint8_t* gh = ph + gi * U::high_bytes(kS) + h * 32;
          const __m256 sv = forms.scales(a.blk_scales, 0, gi, h * 8, sc, sbase + gi * 16 + h * 8);
          alignas(32) float imv[8];
          const float* gmn = (kF & kG32Mins) ? mins.at(gi, h * 8, imv) : nullptr;
          __m256i lo[kS], hi[kS];
          split_unroll<kS>([&](auto tc) __attribute__((always_inline)) {
            u.template at<decltype(tc)::value>(gn, gh, lo[decltype(tc)::value], hi[decltype(tc)::value]);
          });
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            // each step's 4 + 4 activation bytes: broadcast loads, no vpshufd
            const int8_t* y = arow[r] + gi * kS * 8;
            __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[0], bcast4(y)), _mm256_maddubs_epi16(hi[0], bcast4(y + 4)));
            __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[1], bcast4(y + 8)), _mm256_maddubs_epi16(hi[1], bcast4(y + 12)));
            __m256i exact;
            if constexpr (kBits <= 5) {  // codes <= 31: two steps' pairs add in int16 (<= 4 * 2 * 31 * 127)
              exact = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones);
            } else {
              exact = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
            }
            if constexpr (kS == 4) {
              const __m256i p2 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[2], bcast4(y + 16)), _mm256_maddubs_epi16(hi[2], bcast4(y + 20)));
              const __m256i p3 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[3], bcast4(y + 24)), _mm256_maddubs_epi16(hi[3], bcast4(y + 28)));
              if constexpr (kBits <= 5)
                exact = _mm256_add_epi32(exact, _mm256_madd_epi16(_mm256_add_epi16(p2, p3), ones));
              else
                exact = _mm256_add_epi32(exact, _mm256_add_epi32(_mm256_madd_epi16(p2, ones), _mm256_madd_epi16(p3, ones)));
            }
            acc[r] = rows.finish(r, gi, exact, sv, gmn, acc[r]);
          }
        }
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
          _mm256_store_ps(out[r] + h * 8, _mm256_mul_ps(acc[r], _mm256_set1_ps(a.scale[a.row_idx[r0 + r]])));
      }
      write_tile<MR>(w, b, r0, out, c, ldc);
    }
  };
};

// Split codes with integer scales (Q5_K, Q6_K) against activation blocks of 2, 4 or 8 groups of each run of 8, or
// whole runs (run_block_groups): int_avx2_runs.h's runs. Each step's int16 pair sums (<= 2 * 2 * 63 * 127 < 2^15; 5-bit: two steps', <= 4 * 2 * 31 * 127) times the
// group's scales in their vpmaddwd; a zero point (kZc: Q6_K's 32) as minus zc * scale * code sum per group, one more
// vpmaddwd of (zc * scale, 0) pairs and the row's int32 code sum; an int32 sum per run (|sum| <= 8 * (128 * 32 * 63
// * 127 + 128 * 128 * 32 * 127) < 2^31). Integer mins read the int16 code sums, which such blocks set.
inline bool split_runs_fit(const PackedExperts& w, const ActRows& a) {
  const int64_t gl = w.group_len();
  return (gl == 16 || gl == 32) && w.iscale_groups == kIMinRun && (!w.has_mins || w.imin_groups) &&
         (!a.bscale || a.NP == 1) && run_block_groups(w) != 0;
}
// kZc: the (zc * scale, 0) int16 pairs of m's scales (zc * 128 <= 2^14 in magnitude).
template <bool kZc>
__attribute__((always_inline)) inline __m256i split_zero_scales(__m256i m, __m256i zc16) {
  if constexpr (!kZc) return m;
  return _mm256_and_si256(_mm256_mullo_epi16(m, zc16), _mm256_set1_epi32(0xffff));
}
// The 4-bit forms (kNib, PackedExperts::int_nibbles): run_scales of group gi's nibbles, 8 columns at p, or both
// halves' 16 (m[0], m[1]).
__attribute__((always_inline)) inline __m128i nibbles_of(__m128i v, int64_t gi) {
  return _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(int(4 * (gi % 2)))), _mm_set1_epi8(0x0f));
}
__attribute__((always_inline)) inline __m256i run_scales_nib8(const uint8_t* p, int64_t gi) {
  const __m128i v = nibbles_of(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), gi);
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v));
}
__attribute__((always_inline)) inline void run_scales_nib16(const uint8_t* p, int64_t gi, __m256i* m) {
  const __m128i v = nibbles_of(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), gi);
  m[0] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v)), m[1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(v, v));
}
template <int kBits, int kS, int kBlk, bool kMins, bool kZc, int kNB, bool kNib = false>
struct IntAvx2SplitRuns {
  using U = SplitBits<kBits>;
  // Steps whose int16 pair sums add before the scales' vpmaddwd: each step's lane is at most 4 * (2^kBits - 1) * 127
  // (2 bits: 1524; 6 bits: 32004, one step).
  static constexpr int kChunk = std::max(1, std::min(kS, 32767 / (4 * ((1 << kBits) - 1) * 127)));
  // One row, column block b: the row tiles' integers and fp32 operations in their order.
  static void decode(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, float* c) {
    const int64_t G = a.G;
    const uint8_t* pn = w.panel(e, b);
    const uint8_t* ph = w.qhigh.data() + (e * w.num_blocks() + b) * split_high_bytes(a.Kp, w.split_bits);
    const DecodeRow<kBlk> r(w, e, b, a);
    const GroupSidePrefetch side(w, r.forms, r.sx);
    alignas(32) float corr[2][8];
    if constexpr (kMins) int_mins_term_ymm<2, kNB>(r.forms, a.asum16 + r.ri * a.G2, r.bsr, nullptr, corr);
    const U u;
    const __m256i zc16 = _mm256_set1_epi16(int16_t(w.split_zero));
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t gb = 0; gb < G; gb += kNB) {  // the blocks of each run in order
      const int64_t g0 = gb - gb % kIMinRun;  // the run's fp16 d
      __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int64_t gi = gb; gi < std::min(G, gb + kNB); ++gi) {
        side.at<1>(gi);
        const uint8_t* gn = pn + gi * U::low_bytes(kS);
        const uint8_t* gh = ph + gi * U::high_bytes(kS);
        U::template prefetch<kS>(gn, gh);
        __m256i m[2];
        if constexpr (kNib) run_scales_nib16(r.forms.nib_sc(0, gi), gi, m);
        else m[0] = run_scales(r.forms.isc_at(0, gi)), m[1] = run_scales(r.forms.isc_at(0, gi) + 8);
        if constexpr (kZc) {
          const __m256i as = _mm256_set1_epi32(r.asr[gi]);
          _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h)
            isum[h] = _mm256_sub_epi32(isum[h], _mm256_madd_epi16(split_zero_scales<kZc>(m[h], zc16), as));
        }
        __m256i psum[2];  // kChunk steps' int16 pair sums, then one vpmaddwd by the scales (the same int32)
        split_unroll<kS>([&](auto tc) __attribute__((always_inline)) {
          constexpr int t = decltype(tc)::value;
          const __m256i b0 = bcast4(r.y + (gi * kS + t) * 8), b1 = bcast4(r.y + (gi * kS + t) * 8 + 4);
          _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
            __m256i lo, hi;
            u.template at<t>(gn + h * 32, gh + h * 32, lo, hi);
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, b0), _mm256_maddubs_epi16(hi, b1));
            psum[h] = t % kChunk ? _mm256_add_epi16(psum[h], p) : p;
            if constexpr (t % kChunk == kChunk - 1 || t == kS - 1) isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(psum[h], m[h]));
          }
        });
      }
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h)
        acc[h] = run_epilogue<kBlk>(isum[h], r.bsr, gb, half8((kNib ? r.forms.nib_d(0, g0) : r.forms.dsc_at(0, g0)) + h * 8), acc[h]);
    }
    r.store(w, b, a, acc, kMins ? corr : nullptr, c);
  }

  // MR rows x 8 columns at a time, a group's codes unpacked once for every row.
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      static_assert(NJ == 1, "one column block per row tile (drive_even)");
      const int64_t G = a.G;
      const uint8_t* pn = w.panel(e, b);
      const uint8_t* ph = w.qhigh.data() + (e * w.num_blocks() + b) * split_high_bytes(a.Kp, w.split_bits);
      const IntForms forms(w, e, b, G);
      const RunRows<MR, kBlk, kMins, kNB> rows(a, r0, forms);
      alignas(32) float out[MR][16];
      const int32_t* asr[MR];
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) asr[r] = a.asum + a.row_idx[r0 + r] * G;
      const U u;
      const __m256i zc16 = _mm256_set1_epi16(int16_t(w.split_zero));
      NextGroupPrefetch<> pf(w, e, b, 1, r0, MR, a.rows, 2 * a.Kp / 8);
      HighPrefetch<U::kXb != 0> pfh(ph, split_high_bytes(a.Kp, w.split_bits), b + 2 <= w.num_blocks(), r0, MR, a.rows, 2 * a.Kp / 8);
      for (int h = 0; h < 2; ++h) {
        __m256 acc[MR];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t gb = 0; gb < G; gb += kNB) {  // the blocks of each run in order
          const __m256 d = half8((kNib ? forms.nib_d(0, gb) : forms.dsc_at(0, gb - gb % kIMinRun)) + h * 8);
          __m256i isum[MR];
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
          for (int64_t gi = gb; gi < std::min(G, gb + kNB); ++gi) {
            pf.steps(kS), pfh.steps(kS);
            const uint8_t* gn = pn + gi * U::low_bytes(kS) + h * 32;
            const uint8_t* gh = ph + gi * U::high_bytes(kS) + h * 32;
            const __m256i m = kNib ? run_scales_nib8(forms.nib_sc(0, gi) + h * 8, gi) : run_scales(forms.isc_at(0, gi) + h * 8);
            [[maybe_unused]] const __m256i mz = split_zero_scales<kZc>(m, zc16);
            __m256i lo[kS], hi[kS];
            split_unroll<kS>([&](auto tc) __attribute__((always_inline)) {
              u.template at<decltype(tc)::value>(gn, gh, lo[decltype(tc)::value], hi[decltype(tc)::value]);
            });
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
              const int8_t* y = rows.arow[r] + gi * kS * 8;
              __m256i p[kS];
              _Pragma("GCC unroll 4") for (int t = 0; t < kS; ++t)
                p[t] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[t], bcast4(y + 8 * t)), _mm256_maddubs_epi16(hi[t], bcast4(y + 8 * t + 4)));
              __m256i x = kZc ? _mm256_sub_epi32(isum[r], _mm256_madd_epi16(mz, _mm256_set1_epi32(asr[r][gi]))) : isum[r];
              _Pragma("GCC unroll 2") for (int t = 0; t < kS; t += 2) {
                if constexpr (kBits <= 5)  // codes <= 31: two steps' pairs add in int16
                  x = _mm256_add_epi32(x, _mm256_madd_epi16(_mm256_add_epi16(p[t], p[t + 1]), m));
                else
                  x = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_madd_epi16(p[t], m), _mm256_madd_epi16(p[t + 1], m)));
              }
              isum[r] = x;
            }
          }
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) acc[r] = run_epilogue<kBlk>(isum[r], rows.bsr[r], gb, d, acc[r]);
        }
        rows.half(h, acc, a, r0, out);
      }
      rows.write(w, b, r0, out, c, ldc);
    }
  };
};
template <int kBits, int kS, int kBlk, bool kMins, bool kZc, int kNB, bool kNib = false>
void split_runs_nb(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if constexpr (!kNib && kBits == 2 && kS == 2 && kMins && !kZc)  // Q2_K's 4-bit scales and mins (int_nibbles)
    if (w.int_nibbles) return split_runs_nb<kBits, kS, kBlk, kMins, kZc, kNB, true>(w, e, b0, b1, a, c, ldc);
  using T = IntAvx2SplitRuns<kBits, kS, kBlk, kMins, kZc, kNB, kNib>;
  if (a.rows == 1) {
    for (int64_t b = b0; b < b1; ++b) T::decode(w, e, b, a, c + (b - b0) * 16);
    return;
  }
  drive_even<T::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
}
// kNB: the groups of an activation block inside a run (run_block_groups).
template <int kBits, int kS, int kBlk, bool kMins, bool kZc>
void split_runs_as(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if constexpr (kBlk != 0) {
    const int64_t nb = run_block_groups(w);
    if (nb == 2) return split_runs_nb<kBits, kS, kBlk, kMins, kZc, 2>(w, e, b0, b1, a, c, ldc);
    if (nb == 4) return split_runs_nb<kBits, kS, kBlk, kMins, kZc, 4>(w, e, b0, b1, a, c, ldc);
  }
  split_runs_nb<kBits, kS, kBlk, kMins, kZc, kIMinRun>(w, e, b0, b1, a, c, ldc);
}
// The forms that occur: Q5_K (5-bit, integer mins, no zero point), Q6_K (6-bit in groups of 16, zero point 32), and
// either kind with or without each term.
template <int kBits, int kS, int kBlk>
void split_runs(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const bool zc = w.split_zero != 0;
  if (w.has_mins) return zc ? split_runs_as<kBits, kS, kBlk, true, true>(w, e, b0, b1, a, c, ldc)
                            : split_runs_as<kBits, kS, kBlk, true, false>(w, e, b0, b1, a, c, ldc);
  zc ? split_runs_as<kBits, kS, kBlk, false, true>(w, e, b0, b1, a, c, ldc)
     : split_runs_as<kBits, kS, kBlk, false, false>(w, e, b0, b1, a, c, ldc);
}

template <int kBits, int kBlk, int kS>
void split_tiles(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  with_g32_terms<kG32Zc | kG32Mins>(g32_terms(w.split_zero, w.has_mins), [&](auto kf) __attribute__((always_inline)) {
    drive_even<IntAvx2Split<kBits, kBlk, kS, decltype(kf)::value>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
  });
}

template <int kBits, int kBlk, int kS>
void int8_avx2_split_gemm_as(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                             int64_t ldc) {
  // (4-bit forms always fit: derive_int_nibbles takes 2-bit codes in groups of 16 with both integer forms, which every
  // A8 activation block nests with)
  if (split_runs_fit(w, a)) return split_runs<kBits, kS, kBlk>(w, e, b0, b1, a, c, ldc);
  if (a.rows == 1) {
    for (int64_t b = b0; b < b1; ++b) IntAvx2Split<kBits, kBlk, kS>::decode(w, e, b, a, c + (b - b0) * 16);
    return;
  }
  if (!w.imin_groups || !block_scratch_pays(a))  // integer mins: widened per row tile (Q5_K at M = 128: one a block)
    return split_tiles<kBits, kBlk, kS>(w, e, b0, b1, a, c, ldc);
  // three row tiles or more a block: its integer mins widened once for all of them (Q5_K, M = 512, against float
  // mins: 1.034 per tile, 1.006-1.029 so)
  thread_local std::vector<float> buf;
  buf.resize(size_t(a.G * 16) + 8);
  float* blk = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 31) & ~uintptr_t(31));
  ActRows ab = a;
  ab.blk_mins = blk;
  for (int64_t b = b0; b < b1; ++b) {
    store_block_forms(w, e, b, a.G, nullptr, blk);
    split_tiles<kBits, kBlk, kS>(w, e, b, b + 1, ab, c + (b - b0) * 16, ldc);
  }
}

// The int8 GEMM on split codes: 5-bit codes in groups of 32, 2-, 4- and 6-bit in groups of 16 or 32
// (derive_split_codes), per token or with a block scale per group (activation blocks are never shorter than these).
template <int kBits, int kBlk>
void int8_avx2_split_gemm_bits(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                               int64_t ldc) {
  if (kBits == 5 || w.group_len() == 32) return int8_avx2_split_gemm_as<kBits, kBlk, 4>(w, e, b0, b1, a, c, ldc);
  if constexpr (kBits != 5) int8_avx2_split_gemm_as<kBits, kBlk, 2>(w, e, b0, b1, a, c, ldc);
}
template <int kBlk>
void int8_avx2_split_gemm_blk(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                              int64_t ldc) {
  switch (w.split_bits) {
    case 2: return int8_avx2_split_gemm_bits<2, kBlk>(w, e, b0, b1, a, c, ldc);
    case 4: return int8_avx2_split_gemm_bits<4, kBlk>(w, e, b0, b1, a, c, ldc);
    case 5: return int8_avx2_split_gemm_bits<5, kBlk>(w, e, b0, b1, a, c, ldc);
    default: return int8_avx2_split_gemm_bits<6, kBlk>(w, e, b0, b1, a, c, ldc);
  }
}
inline void int8_avx2_split_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                                 int64_t ldc) {
  a.bscale ? int8_avx2_split_gemm_blk<1>(w, e, b0, b1, a, c, ldc) : int8_avx2_split_gemm_blk<0>(w, e, b0, b1, a, c, ldc);
}

// w8a8_avx2's GEMM: split codes here, int8 panels in int_avx2.h (which does not know this header).
template <int MR, int NJ, int ND>
void int8_avx2_codes_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                          int64_t ldc) {
  if (w.split_bits) return int8_avx2_split_gemm(w, e, b0, b1, a, c, ldc);
  int8_avx2_gemm<IntDot::kMaddubs, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}

MOE_ISA_END
