// int_avx2_runs.h — int4 qword panels with integer group scales (Q4_K, IQ4_XS: PackedExperts::iscale_groups)
// against one activation scale per run of 8 groups of 32 (per token, or activation blocks of 256, ggml's Q8_K).
// Each group's exact int32 dot is multiplied by its integer scale inside the vpmaddwd that widens it (the scale in
// place of IntAvx2G32's vector of ones), the run's sum stays in int32 (|sum| <= 8 * 128 * 32 * 128 * 127 < 2^31),
// and each run ends with one fp32 epilogue: converted, times the block scale (kBlk), fmadd with the run's fp16 d.
// Integer mins are the run term (int_mins_term_ymm), subtracted at the end with the row scale applied after, as
// IntAvx2's decode does. Row tiles and decode compute the same integers and the same fp32 operations in the same
// order, so a row's bits do not depend on the rows beside it (docs/numerics.md, "Activation blocks").
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/int_avx2.h"
#include "kernels/int_avx2_g32.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// vpmaddwd multipliers holding group gi's integer scales of columns c8..c8+7 (sc: 8 int8): kQword's in column order,
// one per int16 pair after qword_group's vphaddw (ml); kQwordSigned's per int16 quad of the low / high nibbles'
// columns {0, 1, 4, 5} (ml) and {2, 3, 6, 7} (mh).
template <bool kSigned>
__attribute__((always_inline)) inline void run_scales(const int8_t* sc, __m256i& ml, __m256i& mh) {
  const __m128i s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
  if constexpr (!kSigned) {
    ml = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s, s)), mh = ml;
  } else {
    ml = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 4, 4, 4, 4, 5, 5, 5, 5)));
    mh = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, _mm_setr_epi8(2, 2, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 7, 7, 7, 7)));
  }
}

// kSigned: 8 rows x 16 columns, IntAvx2G32's kQwordSigned products, the low / high nibbles' columns summed over the
// run in two int32 vectors per row and joined by one vphaddd a run; else qword_group with the scales, one per row.
template <bool kSigned, int kBlk, bool kMins>
struct IntAvx2Runs {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      static_assert(NJ == 1, "one column block per row tile (drive_even)");
      const int64_t G = a.G;
      const uint8_t* panel = w.panel(e, b);
      const IntForms forms(w, e, b, G);
      const int8_t* arow[MR];
      const float* bsr[MR];
      alignas(32) float corr[kMins ? MR : 1][2][8];
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        const int64_t ri = a.row_idx[r0 + r];
        arow[r] = a.q + ri * a.Kp, bsr[r] = kBlk ? a.bscale + ri * G : nullptr;
        if constexpr (kMins) int_mins_term_ymm<2>(forms, a.asum16 + ri * a.G2, bsr[r], nullptr, corr[r]);
      }
      const __m256i low4 = _mm256_set1_epi8(0x0f);
      const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codebook)));
      const __m256i abs_table = _mm256_abs_epi8(table);
      NextGroupPrefetch<> pf(w, e, b, 1, r0, MR, a.rows, 2 * a.Kp / 8);
      alignas(32) float out[MR][16];
      for (int h = 0; h < 2; ++h) {
        __m256 acc[MR];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
        const uint8_t* ph = panel + h * 32;
        for (int64_t g0 = 0; g0 < G; g0 += kIMinRun) {
          __m256i s0[MR], s1[kSigned ? MR : 1];
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            s0[r] = _mm256_setzero_si256();
            if constexpr (kSigned) s1[r] = _mm256_setzero_si256();
          }
          for (int64_t gi = g0; gi < std::min(G, g0 + kIMinRun); ++gi) {
            pf.steps(4);
            const uint8_t* pg = ph + gi * 256;
            __m256i ml, mh;
            run_scales<kSigned>(forms.isc_at(0, gi) + h * 8, ml, mh);
            if constexpr (!kSigned) {
              __m256i lo[4], hi[4];
              _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
                const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64));
                lo[t] = _mm256_and_si256(v, low4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
              }
              _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
                s0[r] = _mm256_add_epi32(s0[r], qword_group(lo, hi, arow[r] + gi * 32, ml));
            } else {
              _Pragma("GCC unroll 2") for (int p = 0; p < 2; ++p) {  // two steps' codes at a time: w and |w| in 8 ymm
                __m256i sw[4], aw[4];
                _Pragma("GCC unroll 2") for (int t = 0; t < 2; ++t) {
                  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + (2 * p + t) * 64));
                  const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                  sw[2 * t] = _mm256_shuffle_epi8(table, lo), aw[2 * t] = _mm256_shuffle_epi8(abs_table, lo);
                  sw[2 * t + 1] = _mm256_shuffle_epi8(table, hi), aw[2 * t + 1] = _mm256_shuffle_epi8(abs_table, hi);
                }
                _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
                  const auto d = [&](int q, __m256i yq, __m256i m) __attribute__((always_inline)) {
                    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw[q], _mm256_sign_epi8(yq, sw[q])), m);
                  };
                  const int8_t* y = arow[r] + gi * 32 + p * 16;
                  const __m256i b0 = bcast8(y), b1 = bcast8(y + 8);
                  s0[r] = _mm256_add_epi32(s0[r], _mm256_add_epi32(d(0, b0, ml), d(2, b1, ml)));
                  s1[r] = _mm256_add_epi32(s1[r], _mm256_add_epi32(d(1, b0, mh), d(3, b1, mh)));
                }
              }
            }
          }
          const __m256 d = half8(forms.dsc_at(0, g0) + h * 8);
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            __m256 x = _mm256_cvtepi32_ps(kSigned ? _mm256_hadd_epi32(s0[r], s1[kSigned ? r : 0]) : s0[r]);
            if constexpr (kBlk != 0) x = _mm256_mul_ps(x, _mm256_broadcast_ss(bsr[r] + g0));
            acc[r] = _mm256_fmadd_ps(x, d, acc[r]);
          }
        }
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
          const __m256 v = kMins ? _mm256_sub_ps(acc[r], _mm256_load_ps(corr[kMins ? r : 0][h])) : acc[r];
          _mm256_store_ps(out[r] + h * 8, _mm256_mul_ps(v, _mm256_set1_ps(a.scale[a.row_idx[r0 + r]])));
        }
      }
      const int valid = valid_cols(w, b);
      for (int r = 0; r < MR; ++r) std::memcpy(c + (r0 + r) * ldc, out[r], size_t(valid) * 4);
    }
  };
};

// One row, column block b: the row tiles' integers and fp32 operations in their order (kAbsY: |activation| times the
// codebook value with the activation's sign, as int4_qword_decode_block; the same int32 products).
template <int kBlk, bool kSigned, bool kAbsY>
void int4_runs_decode_block(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, float* c) {
  const int64_t G = a.G;
  const uint8_t* pn = w.panel(e, b);
  const DecodeRow<kBlk> r(w, e, b, a);
  const GroupSidePrefetch side(w, r.forms, r.sx);
  alignas(32) float corr[2][8];
  if (w.has_mins) int_mins_term_ymm<2>(r.forms, a.asum16 + r.ri * a.G2, r.bsr, nullptr, corr);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codebook)));
  const __m256i abs_table = _mm256_abs_epi8(table);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g0 = 0; g0 < G; g0 += kIMinRun) {
    __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int64_t gi = g0; gi < std::min(G, g0 + kIMinRun); ++gi) {
      side.at<1>(gi);
      const uint8_t* pg = pn + gi * 256;
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) _mm_prefetch((const char*)(pg + t * 64 + kDecodePrefetchBytes), _MM_HINT_T1);
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
        __m256i ml, mh;
        run_scales<kSigned>(r.forms.isc_at(0, gi) + h * 8, ml, mh);
        __m256i lo[4], hi[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64 + h * 32));
          lo[t] = _mm256_and_si256(v, low4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        if constexpr (kSigned) {
          __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
          _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
            const __m256i bt = bcast8(r.y + gi * 32 + t * 8);
            [[maybe_unused]] const __m256i at = kAbsY ? _mm256_abs_epi8(bt) : bt;
            const auto d = [&](__m256i u, __m256i m) __attribute__((always_inline)) {
              if constexpr (kAbsY)
                return _mm256_madd_epi16(_mm256_maddubs_epi16(at, _mm256_sign_epi8(_mm256_shuffle_epi8(table, u), bt)), m);
              return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_shuffle_epi8(abs_table, u),
                                                            _mm256_sign_epi8(bt, _mm256_shuffle_epi8(table, u))), m);
            };
            s0 = _mm256_add_epi32(s0, d(lo[t], ml)), s1 = _mm256_add_epi32(s1, d(hi[t], mh));
          }
          isum[h] = _mm256_add_epi32(isum[h], _mm256_hadd_epi32(s0, s1));
        } else {
          isum[h] = _mm256_add_epi32(isum[h], qword_group(lo, hi, r.y + gi * 32, ml));
        }
      }
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
      __m256 x = _mm256_cvtepi32_ps(isum[h]);
      if constexpr (kBlk != 0) x = _mm256_mul_ps(x, _mm256_broadcast_ss(r.bsr + g0));
      acc[h] = _mm256_fmadd_ps(x, half8(r.forms.dsc_at(0, g0) + h * 8), acc[h]);
    }
  }
  r.store(w, b, a, acc, w.has_mins ? corr : nullptr, c);
}

// Column blocks [b0, b1) of expert e (int4_runs_fit): decode for one row (the codebook's form chosen once per call),
// else 8-row tiles.
template <int kBlk, bool kSigned>
void int4_qword_runs(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if (a.rows == 1) {
    const auto blocks = [&](auto abs_y) {
      for (int64_t b = b0; b < b1; ++b) int4_runs_decode_block<kBlk, kSigned, decltype(abs_y)::value>(w, e, b, a, c + (b - b0) * 16);
    };
    if (kSigned && std::find(w.codebook, w.codebook + 16, int8_t(-128)) == w.codebook + 16) return blocks(std::true_type{});
    return blocks(std::false_type{});
  }
  if (w.has_mins) return drive_even<IntAvx2Runs<kSigned, kBlk, true>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
  drive_even<IntAvx2Runs<kSigned, kBlk, false>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
}

MOE_ISA_END
