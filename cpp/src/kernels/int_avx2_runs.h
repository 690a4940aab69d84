// int_avx2_runs.h — integer group scales (PackedExperts::iscale_groups: d * isc per run of 8 groups, the K-quants)
// against one activation scale per run (per token, or activation blocks of 256, ggml's Q8_K), on the vpmaddubsw
// tier: each group's exact int32 dot is multiplied by its integer scale inside the vpmaddwd that widens it (the
// scale in place of IntAvx2G32's vector of ones), the run's sum stays in int32, and each run ends with one fp32
// epilogue: converted, times the block scale (kBlk), fmadd with the run's fp16 d; activation blocks of kNB = 2 or 4
// groups (run_block_groups) end each block of the run so, in order. Integer mins are the run term
// (int_mins_term_ymm), subtracted at the end, then the row scale, as IntAvx2's decode does. Here: int4 plain codes
// on qword panels (Q4_K; |run sum| <= 8 * 128 * 32 * 15 * 127 < 2^31); int_avx2_split.h: 5-bit split codes (Q5_K).
// Row tiles and decode compute the same integers and the same fp32 operations in the same order, so a row's bits do
// not depend on the rows beside it (docs/numerics.md, "Activation blocks").
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/int_avx2.h"
#include "kernels/int_avx2_g32.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// The vpmaddwd multiplier of 8 columns' integer scales (sc: 8 int8), each in both int16 halves of its int32 lane
// (columns in order: qword_group after its vphaddw, or standard panels' int16 pairs).
__attribute__((always_inline)) inline __m256i run_scales(const int8_t* sc) {
  const __m128i s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s, s));
}

// A run tile's rows: activation codes, block scales (kBlk), the integer mins' run term (kMins), and the tile's end
// (the run epilogue below is decode's too).
template <int MR, int kBlk, bool kMins, int kNB>
struct RunRows {
  const int8_t* arow[MR];
  const float* bsr[MR];
  alignas(32) float corr[kMins ? MR : 1][2][8];
  // Half h's sums done: minus the mins term, times each row's scale, to out.
  __attribute__((always_inline)) void half(int h, const __m256* acc, const ActRows& a, int64_t r0, float (*out)[16]) const {
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      const __m256 v = kMins ? _mm256_sub_ps(acc[r], _mm256_load_ps(corr[kMins ? r : 0][h])) : acc[r];
      _mm256_store_ps(out[r] + h * 8, _mm256_mul_ps(v, _mm256_set1_ps(a.scale[a.row_idx[r0 + r]])));
    }
  }
  // The block's valid columns of every row of out to c.
  static void write(const PackedExperts& w, int64_t b, int64_t r0, const float (*out)[16], float* c, int64_t ldc) {
    write_tile<MR>(w, b, r0, out, c, ldc);
  }
  RunRows(const ActRows& a, int64_t r0, const IntForms& forms) {
    [[maybe_unused]] const int16_t* as[MR];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
      const int64_t ri = a.row_idx[r0 + r];
      arow[r] = a.q + ri * a.Kp, bsr[r] = kBlk ? a.bscale + ri * a.G : nullptr;
      if constexpr (kMins) as[r] = a.asum16 + ri * a.G2;
    }
    if constexpr (kMins) int_mins_term_rows<MR, kNB>(forms, as, bsr, corr);
  }
};
// acc plus the run from group g0: its int32 sum converted, times the row's block scale there (bs, kBlk), fmadd d.
template <int kBlk>
__attribute__((always_inline)) inline __m256 run_epilogue(__m256i isum, const float* bs, int64_t g0, __m256 d, __m256 acc) {
  __m256 x = _mm256_cvtepi32_ps(isum);
  if constexpr (kBlk != 0) x = _mm256_mul_ps(x, _mm256_broadcast_ss(bs + g0));
  return _mm256_fmadd_ps(x, d, acc);
}

// 8 rows x 16 columns of plain int4 codes on qword panels, one half-panel of 8 columns at a time: qword_group with
// the scales, an int32 sum per row and block of the run.
template <int kBlk, bool kMins, int kNB>
struct IntAvx2Runs {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      static_assert(NJ == 1, "one column block per row tile (drive_even)");
      const int64_t G = a.G;
      const uint8_t* panel = w.panel(e, b);
      const IntForms forms(w, e, b, G);
      const RunRows<MR, kBlk, kMins, kNB> rows(a, r0, forms);
      alignas(32) float out[MR][16];
      const __m256i low4 = _mm256_set1_epi8(0x0f);
      NextGroupPrefetch<> pf(w, e, b, 1, r0, MR, a.rows, 2 * a.Kp / 8);
      for (int h = 0; h < 2; ++h) {
        __m256 acc[MR];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
        const uint8_t* ph = panel + h * 32;
        for (int64_t gb = 0; gb < G; gb += kNB) {  // the blocks of each run in order
          const __m256 d = half8(forms.dsc_at(0, gb - gb % kIMinRun) + h * 8);
          __m256i isum[MR];
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) isum[r] = _mm256_setzero_si256();
          for (int64_t gi = gb; gi < std::min(G, gb + kNB); ++gi) {
            pf.steps(4);
            const uint8_t* pg = ph + gi * 256;
            const __m256i m = run_scales(forms.isc_at(0, gi) + h * 8);
            __m256i lo[4], hi[4];
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
              const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64));
              lo[t] = _mm256_and_si256(v, low4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
              isum[r] = _mm256_add_epi32(isum[r], qword_group(lo, hi, rows.arow[r] + gi * 32, m));
          }
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) acc[r] = run_epilogue<kBlk>(isum[r], rows.bsr[r], gb, d, acc[r]);
        }
        rows.half(h, acc, a, r0, out);
      }
      rows.write(w, b, r0, out, c, ldc);
    }
  };
};

// One row, column block b: the row tiles' integers and fp32 operations in their order.
template <int kBlk, int kNB>
void int4_runs_decode_block(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, float* c) {
  const int64_t G = a.G;
  const uint8_t* pn = w.panel(e, b);
  const DecodeRow<kBlk> r(w, e, b, a);
  const GroupSidePrefetch side(w, r.forms, r.sx, false, w.has_mins ? 1 : -1);
  alignas(32) float corr[2][8];
  if (w.has_mins) int_mins_term_ymm<2, kNB>(r.forms, a.asum16 + r.ri * a.G2, r.bsr, nullptr, corr);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t gb = 0; gb < G; gb += kNB) {
    const int64_t g0 = gb - gb % kIMinRun;  // the run's fp16 d
    __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int64_t gi = gb; gi < std::min(G, gb + kNB); ++gi) {
      side.at<1>(gi);
      const uint8_t* pg = pn + gi * 256;
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) _mm_prefetch((const char*)(pg + t * 64 + kAvx2Int4PrefetchBytes), _MM_HINT_T1);
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
        __m256i lo[4], hi[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; ++t) {
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64 + h * 32));
          lo[t] = _mm256_and_si256(v, low4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        isum[h] = _mm256_add_epi32(isum[h], qword_group(lo, hi, r.y + gi * 32, run_scales(r.forms.isc_at(0, gi) + h * 8)));
      }
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h)
      acc[h] = run_epilogue<kBlk>(isum[h], r.bsr, gb, half8(r.forms.dsc_at(0, g0) + h * 8), acc[h]);
  }
  r.store(w, b, a, acc, w.has_mins ? corr : nullptr, c);
}

template <int kBlk, int kNB>
void int4_qword_runs_as(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if (a.rows == 1) {
    for (int64_t b = b0; b < b1; ++b) int4_runs_decode_block<kBlk, kNB>(w, e, b, a, c + (b - b0) * 16);
    return;
  }
  if (w.has_mins) return drive_even<IntAvx2Runs<kBlk, true, kNB>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
  drive_even<IntAvx2Runs<kBlk, false, kNB>::template Micro, kG32Rows>(w, e, b0, b1, a, c, ldc);
}
// Column blocks [b0, b1) of expert e (int4_runs_fit): decode for one row, else 8-row tiles; kNB from the blocks.
template <int kBlk>
void int4_qword_runs(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if constexpr (kBlk != 0) {
    const int64_t nb = run_block_groups(w);
    if (nb == 2) return int4_qword_runs_as<kBlk, 2>(w, e, b0, b1, a, c, ldc);
    if (nb == 4) return int4_qword_runs_as<kBlk, 4>(w, e, b0, b1, a, c, ldc);
  }
  int4_qword_runs_as<kBlk, kIMinRun>(w, e, b0, b1, a, c, ldc);
}

MOE_ISA_END
