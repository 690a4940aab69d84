// int_avx512vnni.h — the shared microkernel of w4a8_avx512vnni and w8a8_avx512vnni.
// Per k-step, one 64-byte panel row feeds vpdpbusd with 16 columns x 4 unsigned weight bytes
// (int4: AND 0x0f for k..k+3, shift 4 + AND for k+4..k+7, then with a codebook one vpshufb
// through code_table; int8: the bytes w+128 as stored), against 4 signed activation bytes
// broadcast per row. Exact int32 sums per scale group are corrected by zero * (sum of the group's
// activation codes), converted, scaled per column and accumulated in fp32 (minus min * code sum
// with group offsets); the row scale multiplies at the store. A8 with activation blocks (ActRows::bscale): the
// int32 sums run per piece (a group, or the block where it is shorter than a group) and each converted piece sum
// is multiplied by its block's scale before the column scale (the row scale is then 1).
// A16 (int4_w4a16 / int8_w8a16): the same unsigned weight bytes split into their even and odd bytes as
// int16 (AND 0x00ff, shift 8) meet int16 activation pairs (ActRows::q16, in a16_pos order) in vpdpwssd,
// two per byte vector; the int32 sums run over pieces of at most kA16Piece channels of a group.
// Needs: AVX512F, AVX512BW, AVX512VNNI (compile this header's users with those flags only).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/isa.h"
#include "moe/split_codes.h"

MOE_ISA_BEGIN

// 16 fp16 values (the integer forms' d per run) as fp32: exact.
inline __m512 half16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// acc += dot4(u8, s8) per int32 lane. Inline asm keeps the accumulator in place: GCC 12 copies
// the tied operand of _mm512_dpbusd_epi32 through a spare register inside the loop.
inline void dpbusd(__m512i& acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %[s], %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u8), [s] "v"(s8));
}

// The same with the 4 activation bytes at p broadcast by the instruction's own load ({1to16}),
// which needs no shuffle uop.
inline void dpbusd_bcast(__m512i& acc, __m512i u8, const int8_t* p) {
  asm("vpdpbusd %[m]%{1to16%}, %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u8), [m] "m"(*reinterpret_cast<const int32_t*>(p)));
}

// acc[j] += dot4(u8[j], the 4 bytes at p) for the NJ panels of one row. kShare (row tiles with
// NJ >= 2): the bytes broadcast once into a register for every panel; the {1to16} form loads them
// per vpdpbusd, and those loads bound the tile (13-18% at M = 1024 on Zen 5). Else {1to16}: decode
// (one row, one panel) gains nothing from sharing.
template <bool kShare, int NJ>
inline __attribute__((always_inline)) void dpbusd_row(__m512i (&acc)[NJ], const __m512i (&u8)[NJ], const int8_t* p) {
  if constexpr (kShare) {
    const __m512i av = _mm512_set1_epi32(load_i32(p));
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dpbusd(acc[j], u8[j], av);
  } else {
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dpbusd_bcast(acc[j], u8[j], p);
  }
}

// acc += pairs of int16 products (the integer mins: imin pairs by code-sum pairs; A16: weights by codes).
inline void dpwssd(__m512i& acc, __m512i m, __m512i a) {
  asm("vpdpwssd %[a], %[m], %[acc]" : [acc] "+v"(acc) : [m] "v"(m), [a] "v"(a));
}
inline void dpwssd_bcast(__m512i& acc, __m512i m, const int16_t* p) {
  asm("vpdpwssd %[p]%{1to16%}, %[m], %[acc]" : [acc] "+v"(acc) : [m] "v"(m), [p] "m"(*reinterpret_cast<const int32_t*>(p)));
}
// A16: acc[j] += the NJ panels' int16 words times the code pair at p (as dpbusd_row).
template <bool kShare, int NJ>
inline __attribute__((always_inline)) void dpwssd_row(__m512i (&acc)[NJ], const __m512i (&w16)[NJ], const int16_t* p) {
  if constexpr (kShare) {
    int32_t pair;
    std::memcpy(&pair, p, 4);
    const __m512i av = _mm512_set1_epi32(pair);
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dpwssd(acc[j], w16[j], av);
  } else {
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dpwssd_bcast(acc[j], w16[j], p);
  }
}
// A16: acc += the unsigned weight bytes u8 (4 channels k..k+3 per column) times codes p[0..4) (a16_pos order:
// k, k+2, k+1, k+3): the even bytes meet the first pair (into acc), the odd bytes the second (into odd, which
// may be acc itself: decode keeps two chains per panel, as the dot products' latency bounds one).
template <bool kShare, int MR, int NJ>
inline __attribute__((always_inline)) void a16_rows(__m512i (&acc)[MR][NJ], __m512i (&odd)[MR][NJ], const __m512i (&u8)[NJ],
                                                    const int16_t* const (&arow)[MR], int64_t k) {
  __m512i w16[NJ];
  const __m512i even = _mm512_set1_epi16(0xff);
  _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) w16[j] = _mm512_and_si512(u8[j], even);
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) dpwssd_row<kShare>(acc[r], w16, arow[r] + k);
  _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) w16[j] = _mm512_srli_epi16(u8[j], 8);
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) dpwssd_row<kShare>(odd[r], w16, arow[r] + k + 2);
}

// acc -= m * (*p broadcast): the mins term, with the code sum read by the FMA's own broadcast.
inline void fnmadd_bcast(__m512& acc, __m512 m, const float* p) {
  asm("vfnmadd231ps %[p]%{1to16%}, %[m], %[acc]" : [acc] "+v"(acc) : [m] "v"(m), [p] "m"(*p));
}

// How the weights' offset enters: an implicit zero point (code_zero, or 128 for int8) folded into
// the group's starting sum; stored zero points per (column, group); float mins (with the implicit
// zero), one FMA per group; or integer mins (PackedExperts::imins), after the groups: per run of 8
// groups, 4 vpdpwssd of (imin pair, code sum pair) and one FMA by dmin.
enum class Offset { kImplicit, kZeros, kMins, kIntMins };

// The 4-bit forms (PackedExperts::int_nibbles, GGUF Q2_K): 16 columns' nibbles of group gi (its half of each byte
// at p), and the imin pair (even, odd group) of panel j's pair p as 16 int16 pairs, as imn_pair's int8 pairs widen.
inline __m128i nibbles16(const uint8_t* p, int64_t gi) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(int(4 * (gi % 2)))), _mm_set1_epi8(0x0f));
}
inline __m512i imin_pairs16(const IntFormBlock& f, int64_t j, int64_t p) {
  if (!f.nib) return _mm512_cvtepi8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(f.imn_pair(j, p))));
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(f.nib_mn(j, p))), m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)));
}

// With activation blocks shorter than a run: the imins as fp32 against the groups' fp32 code sums
// (ActRows::asum_f32, already times their block scales), per run in group order, then times dmin.
template <int MR, int NJ>
__attribute__((noinline)) void int_mins_term_f32(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0,
                                                 float* corr) {
  constexpr int64_t S2 = kIMinRun / 2;
  const int64_t G = a.G, pairs = (G + 1) / 2;
  const IntFormBlock f(w, e, b, G);
  const float* af[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) af[r] = a.asum_f32 + a.row_idx[r0 + r] * G;
  __m512 sum[MR][NJ];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) sum[r][j] = _mm512_setzero_ps();
  for (int64_t s = 0; s < f.runs; ++s) {
    __m512 acc[MR][NJ];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t p = s * S2; p < std::min(pairs, (s + 1) * S2); ++p) {
      __m512 ev[NJ], od[NJ];  // the pair's even and odd groups' imins of 16 columns
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
        const __m512i mv = imin_pairs16(f, j, p);
        ev[j] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(mv, 16), 16));
        od[j] = _mm512_cvtepi32_ps(_mm512_srai_epi32(mv, 16));
      }
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        const __m512 fe = _mm512_set1_ps(af[r][2 * p]), fo = _mm512_set1_ps(2 * p + 1 < G ? af[r][2 * p + 1] : 0.f);
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j)
          acc[r][j] = _mm512_fmadd_ps(od[j], fo, _mm512_fmadd_ps(ev[j], fe, acc[r][j]));
      }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
      const __m512 dv = half16(f.dmin_at(j, s));
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) sum[r][j] = _mm512_fmadd_ps(acc[r][j], dv, sum[r][j]);
    }
  }
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) _mm512_store_ps(corr + (r * NJ + j) * 16, sum[r][j]);
}

// corr[r][j][16] = dmin * sum over the run's groups of imin * asum, summed over runs of
// imin_groups groups (exact int32 sums per run: derive_int_mins bounds them); with activation blocks each block's
// int32 sum (kNB groups: one per run, or 2 / 4 groups of it: run_block_groups) converted, times its block scale, the
// run's further blocks fused in (fma) in order, then times dmin (the AVX2 tier's order). Out of line, so that the
// main loop's registers are those of the other offset forms: row tiles call it before that loop, decode after it
// (its groups prefetched the lines: paired on Zen 4, Q2_K decode 0.95-0.98 of the time before).
template <int MR, int NJ, int kNB = kIMinRun>
__attribute__((noinline)) void int_mins_term(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0,
                                             float* corr) {
  if constexpr (kNB == kIMinRun)
    if (a.bscale && imins_f32(w)) {
      const int64_t nb = run_block_groups(w);
      if (nb == 4) return int_mins_term<MR, NJ, 4>(w, e, b, a, r0, corr);
      if (nb == 2) return int_mins_term<MR, NJ, 2>(w, e, b, a, r0, corr);
      return int_mins_term_f32<MR, NJ>(w, e, b, a, r0, corr);
    }
  constexpr int64_t S2 = kIMinRun / 2;  // pairs per run (imin_groups is kIMinRun)
  const int64_t runs = a.G2 / kIMinRun, G = a.G;  // a.G2 = 2 imin_pairs(w): no divisions
  const int16_t* as[MR];
  const float* bs[MR];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
    as[r] = a.asum16 + a.row_idx[r0 + r] * a.G2;
    bs[r] = a.bscale ? a.bscale + a.row_idx[r0 + r] * G : nullptr;
  }
  // Panels inner: each row's code-sum pair is broadcast once into a register for the NJ panels
  // (as in dpbusd_row).
  const IntFormBlock f(w, e, b, a.G);
  __m512 sum[MR][NJ];
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) sum[r][j] = _mm512_setzero_ps();
  for (int64_t s = 0; s < runs; ++s) {
    __m512 x[MR][NJ];
    _Pragma("GCC unroll 4") for (int k = 0; k < kIMinRun / kNB; ++k) {
      const int64_t g = s * kIMinRun + k * kNB;
      if (k > 0 && g >= G) break;  // the last run's padding: no block, zero sums
      __m512i acc[MR][NJ];
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) acc[r][j] = _mm512_setzero_si512();
      _Pragma("GCC unroll 4") for (int q = 0; q < kNB / 2; ++q) {  // a compile-time count: fully unrolled
        const int64_t p = s * S2 + k * (kNB / 2) + q;
        __m512i mv[NJ];
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j)
          mv[j] = imin_pairs16(f, j, p);
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
          int32_t pair;
          std::memcpy(&pair, as[r] + 2 * p, 4);
          const __m512i av = _mm512_set1_epi32(pair);
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dpwssd(acc[r][j], mv[j], av);
        }
      }
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
          const __m512 xb = _mm512_cvtepi32_ps(acc[r][j]);
          if (!bs[r]) x[r][j] = xb;
          else if (k == 0) x[r][j] = _mm512_mul_ps(xb, _mm512_set1_ps(bs[r][g]));
          else x[r][j] = _mm512_fmadd_ps(xb, _mm512_set1_ps(bs[r][g]), x[r][j]);
        }
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
      const __m512 dv = half16(f.dmin_at(j, s));
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) sum[r][j] = _mm512_fmadd_ps(x[r][j], dv, sum[r][j]);
    }
  }
  _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) _mm512_store_ps(corr + (r * NJ + j) * 16, sum[r][j]);
}

// The 16 fp32 scales of (panel j, group gi) from the integer form: float(isc) * d, the stored floats (d: the run's
// fp16 d widened, which decode does once per run).
// kNib: from the 4-bit forms (d: the span's).
template <bool kNib = false>
inline __m512 int_scale16(const IntFormBlock& f, int64_t j, int64_t gi, __m512 d) {
  const __m128i v = kNib ? nibbles16(f.nib_sc(j, gi), gi) : _mm_load_si128(reinterpret_cast<const __m128i*>(f.isc_at(j, gi)));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), d);
}
inline __m512 int_scale16(const IntFormBlock& f, int64_t j, int64_t gi) {
  return f.nib ? int_scale16<true>(f, j, gi, half16(f.nib_d(j, gi))) : int_scale16(f, j, gi, half16(f.dsc_at(j, gi)));
}

// Split codes' planes (int_avx512vnni_split.h): kBits-bit codes, a group's kS steps of 8 k.
template <int kBits, int kS>
struct SplitVnni;

// kBlk: A8 activation blocks (ActRows::bscale), instances of their own so that the per-token code stays as it was:
// 1 a block scale per group (blocks of the group length or longer), 2 pieces (blocks shorter than a group).
// kSplit: int8 weights as split codes of kSplit bits in groups of kSS steps of 8 k (decode only: one row, one panel).
template <bool kInt4, bool kShuffle = false, Offset kOff = Offset::kImplicit, bool kA16 = false, int kBlk = 0,
          int kSplit = 0, int kSS = 0>
struct IntVnni {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      static_assert(!kSplit || (MR == 1 && NJ == 1 && !kInt4 && !kA16), "split codes: int8 decode");
      // Q2_K's 4-bit forms reach decode only here (2-bit split codes with integer mins; row tiles read a.blk_scales)
      constexpr bool kMayNib = kSplit == 2 && kOff == Offset::kIntMins;
      constexpr int64_t step = kInt4 || kSplit ? 8 : 4;
      constexpr bool kShare = MR > 1 && NJ >= 2;  // see dpbusd_row
      const int64_t G = a.G, gl = w.group_len(), Kp = a.Kp;  // a.G: w.num_groups() without a division
      const uint8_t* panel[NJ];  // int8 panels widened from split codes (ActRows::wpanels), or the weights' own
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j)
        panel[j] = a.wpanels ? a.wpanels + (b + j - a.wpanel_b) * Kp * 16 : w.panel(e, b + j);
      [[maybe_unused]] const uint8_t* high = nullptr;  // split codes' high bits (PackedExperts::qhigh)
      if constexpr (kSplit != 0) high = w.qhigh.data() + (e * w.num_blocks() + b) * split_high_bytes(Kp, kSplit);
      const int8_t* arow[MR];
      const int16_t* arow16[MR];  // A16
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        if constexpr (kA16) arow16[r] = a.q16 + a.row_idx[r0 + r] * Kp;
        else arow[r] = a.q + a.row_idx[r0 + r] * Kp;
      }
      // NP code sums per group, one per piece of ps k-steps (A16, or A8 blocks shorter than a group; else one piece,
      // the group). A8 blocks: each piece's block scale in bsr.
      const int64_t NP = kA16 || kBlk == 2 ? a.NP : 1, ps = kA16 ? kA16Piece / step : NP > 1 ? a.pk / step : Kp;
      [[maybe_unused]] const float* bsr[kBlk ? MR : 1];
      if constexpr (kBlk != 0)
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) bsr[r] = a.bscale + a.row_idx[r0 + r] * G * NP;
      const float* asrow[MR];  // fp32 group code sums, for the mins term
      if constexpr (kOff == Offset::kMins)
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) asrow[r] = a.asum_f32 + a.row_idx[r0 + r] * G;
      const __m512i low4 = _mm512_set1_epi8(0x0f);
      // code_table in every 128-bit lane (vpshufb looks up within lanes)
      const __m512i table = _mm512_maskz_broadcast_i32x4(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.code_table)));
      const float* scales = w.scales.as<float>();
      // Integer scales (int4): each group's float scale is isc * d, the same float as the stored one; row
      // tiles read them from the column group's fp32 scratch (a.blk_scales, built by int4_vnni_gemm).
      const IntFormBlock forms(w, e, b, G);
      // Per-call constants in locals (not reloaded from w and a after every store).
      const float* mins = kOff == Offset::kMins ? w.mins.as<float>() : nullptr;
      const uint8_t* zeros = kOff == Offset::kZeros ? w.zeros.data() : nullptr;
      const int zc = kInt4 ? w.code_zero : kSplit || a.wpanels ? w.split_zero : layout::implicit_zero(w.scheme);
      const int32_t* asr[MR];  // each row's group (A16: piece) code sums
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) asr[r] = a.asum + a.row_idx[r0 + r] * G * NP;
      __m512 accf[MR][NJ];
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) accf[r][j] = _mm512_setzero_ps();
      NextGroupPrefetch<(MR * NJ + 15) / 16> pf(w, e, b, NJ, r0, MR, a.rows, Kp / step);
      const ScaleIndex sx(w, e, b, G);
      alignas(64) float corr[kOff == Offset::kIntMins ? MR * NJ * 16 : 1];
      if constexpr (kOff == Offset::kIntMins && MR > 1) int_mins_term<MR, NJ>(w, e, b, a, r0, corr);
      const GroupSidePrefetch side(w, forms, sx, false, kOff == Offset::kIntMins && MR == 1 ? 0 : -1);  // decode's int mins
      [[maybe_unused]] __m512 run_d[MR == 1 ? NJ : 1];  // decode: the run's fp16 d, widened once per run
      for (int64_t gi = 0; gi < G; ++gi) {
        if constexpr (MR == 1) {
          side.at<NJ>(gi);
          if (forms.isc && gi % kIMinRun == 0)
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j)
              run_d[j] = half16(kMayNib && forms.nib ? forms.nib_d(j, gi) : forms.dsc_at(j, gi));
        }
        const int64_t g0 = gi * gl / step, g1 = gi == G - 1 ? Kp / step : (gi + 1) * gl / step;
       for (int64_t pi = 0; pi < NP; ++pi) {
        const int64_t s0 = g0 + pi * ps, s1 = pi == NP - 1 ? g1 : s0 + ps, ai = gi * NP + pi;
        // Without stored zeros the implicit zero point's term (zero * group code sum) is the same for
        // every column: it starts the int32 sum, so the group ends with a plain convert.
        __m512i acc[MR][NJ], acc2[MR][NJ];  // acc2: A16 decode's second chain (the odd bytes)
        constexpr bool kTwo = kA16 && MR == 1;
        auto& odd = kTwo ? acc2 : acc;
        if constexpr (kTwo)
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) acc2[0][j] = _mm512_setzero_si512();
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
          const __m512i start = kOff == Offset::kZeros ? _mm512_setzero_si512() : _mm512_set1_epi32(-zc * asr[r][ai]);
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) acc[r][j] = start;
        }
        const auto step_at = [&](int64_t t) __attribute__((always_inline)) {
          // decode streams weights from DRAM (larger tiles reuse them from L2): far ahead into L2, and nearer into L1
          // (kDecodeL1Bytes; Zen 4: one stream a core then reads 25 GB/s instead of 20)
          if constexpr (MR == 1)
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
              _mm_prefetch((const char*)(panel[j] + t * 64 + kDecodePrefetchBytes), _MM_HINT_T1);
              _mm_prefetch((const char*)(panel[j] + t * 64 + kDecodeL1Bytes<kInt4>), _MM_HINT_T0);
            }
          if constexpr (kInt4) {
            __m512i lo[NJ], hi[NJ];
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
              const __m512i v = _mm512_load_si512(panel[j] + t * 64);
              lo[j] = _mm512_and_si512(v, low4);
              hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
              if constexpr (kShuffle) lo[j] = _mm512_shuffle_epi8(table, lo[j]), hi[j] = _mm512_shuffle_epi8(table, hi[j]);
            }
            if constexpr (kA16) {
              a16_rows<kShare>(acc, odd, lo, arow16, t * 8), a16_rows<kShare>(acc, odd, hi, arow16, t * 8 + 4);
            } else {
              _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
                dpbusd_row<kShare>(acc[r], lo, arow[r] + t * 8), dpbusd_row<kShare>(acc[r], hi, arow[r] + t * 8 + 4);
            }
          } else {
            __m512i wv[NJ];
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) wv[j] = _mm512_load_si512(panel[j] + t * 64);
            if constexpr (kA16) a16_rows<kShare>(acc, odd, wv, arow16, t * 4);
            else _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) dpbusd_row<kShare>(acc[r], wv, arow[r] + t * 4);
          }
        };
        if constexpr (kSplit != 0) {
          __m512i acc_hi = _mm512_setzero_si512();  // a second chain: the steps' high halves
          SplitVnni<kSplit, kSS>::group(panel[0], high, arow[0], s0, acc[0][0], acc_hi);
          acc[0][0] = _mm512_add_epi32(acc[0][0], acc_hi);
        } else {
          group_steps<!kInt4, (MR > 1)>(pf, s0, s1, step_at);
        }
        if constexpr (kTwo)
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) acc[0][j] = _mm512_add_epi32(acc[0][j], acc2[0][j]);
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
          const int64_t si = sx(j, gi);
          const __m512 sv =
              a.blk_scales ? _mm512_load_ps(a.blk_scales + (j * G + gi) * 16)
              : forms.hsc          ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(forms.hsc + si)))
              : kMayNib && forms.nib ? int_scale16<true>(forms, j, gi, run_d[0])
              : forms.isc          ? (MR == 1 ? int_scale16(forms, j, gi, run_d[MR == 1 ? j : 0]) : int_scale16(forms, j, gi))
                                   : _mm512_load_ps(scales + si);
          if constexpr (kOff == Offset::kZeros) {
            const __m512i zv = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(zeros + si)));
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
              const __m512i corr = _mm512_mullo_epi32(zv, _mm512_set1_epi32(asr[r][ai]));
              acc[r][j] = _mm512_sub_epi32(acc[r][j], corr);
            }
          }
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            __m512 f = _mm512_cvtepi32_ps(acc[r][j]);
            if constexpr (kBlk != 0) f = _mm512_mul_ps(f, _mm512_set1_ps(bsr[r][ai]));
            accf[r][j] = _mm512_fmadd_ps(f, sv, accf[r][j]);
          }
        }
       }
        if constexpr (kOff == Offset::kMins)
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
            const __m512 mv = _mm512_load_ps(mins + sx(j, gi));
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) fnmadd_bcast(accf[r][j], mv, asrow[r] + gi);
          }
      }
      if constexpr (kOff == Offset::kIntMins && MR == 1) int_mins_term<MR, NJ>(w, e, b, a, r0, corr);
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
        const __mmask16 m = __mmask16((1u << valid_cols(w, b + j)) - 1);
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
          _mm512_mask_storeu_ps(c + (r0 + r) * ldc + 16 * j, m,
                                _mm512_mul_ps(kOff == Offset::kIntMins ? _mm512_sub_ps(accf[r][j], _mm512_load_ps(corr + (r * NJ + j) * 16)) : accf[r][j],
                                              _mm512_set1_ps(a.scale[a.row_idx[r0 + r]])));
      }
    }
  };
};

// The GEMM with the weights' offset form (and, for int4, the codebook shuffle) fixed at compile time.
// A16 kernels take float mins (their code sums do not fit the integer mins' int16 pairs).
template <bool kInt4, bool kShuffle, int MR, int NJ, int ND, bool kA16, int kBlk>
void int_vnni_gemm_forms(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                         int64_t ldc) {
  if (w.has_zeros) drive<IntVnni<kInt4, kShuffle, Offset::kZeros, kA16, kBlk>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  else if (!kA16 && w.has_mins && w.imin_groups) drive<IntVnni<kInt4, kShuffle, Offset::kIntMins, false, kBlk>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  else if (w.has_mins) drive<IntVnni<kInt4, kShuffle, Offset::kMins, kA16, kBlk>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  else drive<IntVnni<kInt4, kShuffle, Offset::kImplicit, kA16, kBlk>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}
template <bool kInt4, bool kShuffle, int MR, int NJ, int ND, bool kA16 = false>
void int_vnni_gemm_offset(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                          int64_t ldc) {
  if constexpr (!kA16)
    if (a.bscale)
      return a.NP > 1 ? int_vnni_gemm_forms<kInt4, kShuffle, MR, NJ, ND, false, 2>(w, e, b0, b1, a, c, ldc)
                      : int_vnni_gemm_forms<kInt4, kShuffle, MR, NJ, ND, false, 1>(w, e, b0, b1, a, c, ldc);
  int_vnni_gemm_forms<kInt4, kShuffle, MR, NJ, ND, kA16, 0>(w, e, b0, b1, a, c, ldc);
}

// The int4 GEMM: codes mapped through code_table when it is not the identity.
template <int MR, int NJ, int ND, bool kA16 = false>
void int4_vnni_codes_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                          int64_t ldc) {
  if (w.code_shuffle) int_vnni_gemm_offset<true, true, MR, NJ, ND, kA16>(w, e, b0, b1, a, c, ldc);
  else int_vnni_gemm_offset<true, false, MR, NJ, ND, kA16>(w, e, b0, b1, a, c, ldc);
}

// With integer scales, row tiles read each column group's fp32 scales from a scratch built once per group
// (isc * d; built per tile they cost iq4_xs about 2% at M = 1024); decode builds them per group inline.
// gemm(w, e, b, b + nj, rows with blk_scales, c, ldc) per group of NJ blocks.
template <int NJ, class Gemm>
void with_block_scales(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc,
                       Gemm gemm) {
  const int64_t G = a.G;
  std::vector<float> buf(size_t(NJ * G * 16) + 16);
  float* blk = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
  ActRows ab = a;
  ab.blk_scales = blk;
  for (int64_t b = b0; b < b1; b += NJ) {
    const int64_t nj = std::min<int64_t>(NJ, b1 - b);
    const IntFormBlock forms(w, e, b, G);
    for (int64_t j = 0; j < nj; ++j)
      for (int64_t gi = 0; gi < G; ++gi) _mm512_store_ps(blk + (j * G + gi) * 16, int_scale16(forms, j, gi));
    gemm(w, e, b, b + nj, ab, c + (b - b0) * 16, ldc);
  }
}
template <int MR, int NJ, int ND, bool kA16 = false>
void int4_vnni_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                    int64_t ldc) {
  if (a.rows == 1 || !w.iscale_groups) return int4_vnni_codes_gemm<MR, NJ, ND, kA16>(w, e, b0, b1, a, c, ldc);
  with_block_scales<NJ>(w, e, b0, b1, a, c, ldc, int4_vnni_codes_gemm<MR, NJ, ND, kA16>);
}

// The int8 GEMM. With scale groups the tile is half as wide: MR x NJ int32 sums and as many fp32
// group sums must both stay in the 32 zmm registers (6 x 4 + 6 x 4 would spill the fp32 ones).
// Integer scales (Q6_K, Q5_K): row tiles as int4_vnni_gemm's.
template <int MR, int NJ, int ND, bool kA16 = false>
void int8_vnni_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                    int64_t ldc) {
  if (w.num_groups() == 1) return int_vnni_gemm_offset<false, false, MR, NJ, ND, kA16>(w, e, b0, b1, a, c, ldc);
  if (a.rows == 1 || !w.iscale_groups) return int_vnni_gemm_offset<false, false, MR, NJ / 2, ND, kA16>(w, e, b0, b1, a, c, ldc);
  with_block_scales<NJ / 2>(w, e, b0, b1, a, c, ldc, int_vnni_gemm_offset<false, false, MR, NJ / 2, ND, kA16>);
}

MOE_ISA_END
