// int_avx2.h — the shared microkernel of the ymm int kernels: 8 columns per ymm, each int32 lane
// one column's 4 k bytes.
//   IntDot::kMaddubs (w4a8_avx2, w8a8_avx2; AVX2 + FMA): vpmaddubsw + vpmaddwd emulate vpdpbusd.
//     int4: u in [0,15] x s8 activations: pair sums <= 2*15*127, no int16 saturation; the zero
//           point is removed with the group's activation sum, as in the VNNI kernel.
//     int8: w = u ^ 0x80 (signed); vpmaddubsw(|w|, sign(a, w)) gives w*a pairs <= 2*128*127 without
//           saturation, so the sums are already zero-point free.
//     int4 codebooks (Codes): kTable maps the codes through code_table (vpshufb) when its bytes are
//           <= 31 (MXFP4: 0..24), with int16 sums of 2 k-steps instead of 4 so they cannot wrap; kSigned maps
//           them to |codebook| and codebook and multiplies as int8 does (IQ4_NL: -127..113).
//   IntDot::kVnniVex (w4a8_avx2vnni, w8a8_avx2vnni; + AVX-VNNI): {vex} vpdpbusd on the stored
//     unsigned bytes (int4 codebooks: through code_table), zero point (code_zero, 128 or stored)
//     removed with the activation sums.
// Group offsets (mins): minus min * code sum per group, in fp32. A8 activation blocks (ActRows::bscale): int32
// sums per piece (group, or block when shorter), each converted sum times its block scale, then the column scale. int4 K-quant forms: integer scales and
// mins (PackedExperts::iscales / imins) become those same fp32 values in the group epilogue.
//   IntDot::kMaddwd16 (w4a16_avx2, w8a16_avx2; AVX2 + FMA): A16's int16 activations. The unsigned weight
//     bytes as in kVnniVex, split into even and odd bytes as int16, meet int16 code pairs (ActRows::q16, in
//     a16_pos order) in vpmaddwd + vpaddd; int32 sums per piece of at most kA16Piece channels.
//   IntDot::kVnniEvex: the same loop with the EVEX form of the instruction (AVX512-VNNI + VL, same
//     semantics); only the test suite builds it, to run the kVnniVex source on CPUs without AVX-VNNI.
// Tile: MR rows x 16 columns per block (two ymm halves).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "moe/qword_panels.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// 8 fp16 values (the integer forms' d per run) as fp32: exact.
inline __m256 half8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

enum class IntDot { kMaddubs, kVnniVex, kVnniEvex, kMaddwd16 };
// How int4 codes become multiplier bytes: as stored, through code_table, or as |codebook| with the
// sign moved onto the activations (vpmaddubsw with code_table bytes > 31).
// kQword / kQwordSigned: kPlain / kSigned codes in qword panels (moe/qword_panels.h); kQwordTable: kQwordSigned's
// panels read through code_table (bytes <= 64) with the zero point's term, no sign moved (int_avx2_g32.h)
enum class Codes { kPlain, kTable, kSigned, kQword, kQwordSigned, kQwordTable };

// acc += dot4(u8, s8) per int32 lane, accumulator in place (as in int_avx512vnni.h).
template <IntDot D>
inline void dpbusd_ymm(__m256i& acc, __m256i u8, __m256i s8) {
  if constexpr (D == IntDot::kVnniVex)
    asm("%{vex%} vpdpbusd %[s], %[u], %[acc]" : [acc] "+x"(acc) : [u] "x"(u8), [s] "x"(s8));
  else
    asm("vpdpbusd %[s], %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u8), [s] "v"(s8));
}

// 8 columns' int8 imin pairs at m as int16 pairs in 8 int32 lanes.
inline __m256i imin_pair8(const int8_t* m) { return _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(m))); }
// The same from the 4-bit form: 8 columns' bytes at m, the even group's nibble low, the odd group's high.
inline __m256i imin_pair8_nib(const uint8_t* m) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)), low4 = _mm_set1_epi8(0x0f);
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(v, low4), _mm_and_si128(_mm_srli_epi16(v, 4), low4)));
}

// The fp32 scale and min of (panel j, group gi, columns c8..c8+7), from where the weights hold them: a
// column block's values built once for its row tiles (ActRows::blk_*, by int4_avx2_gemm), fp16 scales
// (hsc + i, widened exactly), the integer forms (isc * d, imin * dmin: the same floats), or the fp32 arrays (f32 + i).
struct IntForms : IntFormBlock {
  int64_t G;
  IntForms(const PackedExperts& w, int64_t e, int64_t b, int64_t G_) : IntFormBlock(w, e, b, G_), G(G_) {}
  // The fp16 d (scales) and dmin (mins) of the run of group gi, 8 columns, widened: decode loops widen them once
  // per run and pass them to scales() / mins() (widened per group, Q5_K / Q6_K decode on AVX-512 ran 3% slower).
  __m256 run_d(int64_t j, int64_t gi, int64_t c8) const { return isc ? half8(dsc_at(j, gi) + c8) : _mm256_setzero_ps(); }
  __m256 run_dmin(int64_t j, int64_t gi, int64_t c8) const {
    return imn ? half8(dmn_run(j, gi / kIMinRun) + c8) : _mm256_setzero_ps();
  }
  __m256 scales(const float* blk, int64_t j, int64_t gi, int64_t c8, const float* f32, int64_t i) const {
    return scales(blk, j, gi, c8, f32, i, isc && !blk ? run_d(j, gi, c8) : _mm256_setzero_ps());
  }
  __m256 scales(const float* blk, int64_t j, int64_t gi, int64_t c8, const float* f32, int64_t i, __m256 d) const {
    if (blk) return _mm256_load_ps(blk + (j * G + gi) * 16 + c8);
    if (hsc) return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(hsc + i)));
    if (isc)
      return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(isc_at(j, gi) + c8)))), d);
    return _mm256_load_ps(f32 + i);
  }
  __m256 mins(const float* blk, int64_t j, int64_t gi, int64_t c8, const float* f32, int64_t i) const {
    return mins(blk, j, gi, c8, f32, i, imn && !blk ? run_dmin(j, gi, c8) : _mm256_setzero_ps());
  }
  __m256 mins(const float* blk, int64_t j, int64_t gi, int64_t c8, const float* f32, int64_t i, __m256 dm) const {
    if (blk) return _mm256_load_ps(blk + (j * G + gi) * 16 + c8);
    if (imn) {  // the pair (gi even, gi odd) of 8 columns: int16 halves of 8 int32 lanes
      const __m256i pr = imin_pair8(imn_pair(j, gi / 2) + 2 * c8);
      const __m256i im = gi % 2 ? _mm256_srai_epi32(pr, 16) : _mm256_srai_epi32(_mm256_slli_epi32(pr, 16), 16);
      return _mm256_mul_ps(_mm256_cvtepi32_ps(im), dm);
    }
    return _mm256_load_ps(f32 + i);
  }
};

// The int16 path of int_mins_term_ymm for MR rows (as: their int16 code sums, bs: their block scales or nullptr):
// the same operations per row in the same order, each run's imins and dmin read once for all of them.
template <int MR, int kNB, int H = 2>
void int_mins_term_rows(const IntForms& f, const int16_t* const* as, const float* const* bs, float (*corr)[H][8]) {
  _Pragma("GCC unroll 4") for (int h = 0; h < H; ++h) {
    const int64_t j = h / 2, c8 = (h % 2) * 8;
    __m256 sum[MR];
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) sum[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < f.runs; ++s) {
      __m256i pr[kIMinRun / 2];
      _Pragma("GCC unroll 4") for (int q = 0; q < kIMinRun / 2; ++q) {
        const int64_t p = s * (kIMinRun / 2) + q;
        pr[q] = f.nib ? imin_pair8_nib(f.nib_mn(j, p) + c8) : imin_pair8(f.imn_pair(j, p) + 2 * c8);
      }
      const __m256 dm = half8(f.dmin_at(j, s) + c8);
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        __m256 x;
        _Pragma("GCC unroll 4") for (int k = 0; k < kIMinRun / kNB; ++k) {
          const int64_t g = s * kIMinRun + k * kNB;
          if (k > 0 && g >= f.G) break;  // the last run's padding: no block, zero sums
          __m256i acc = _mm256_setzero_si256();
          _Pragma("GCC unroll 4") for (int q = 0; q < kNB / 2; ++q) {
            int32_t pair;
            std::memcpy(&pair, as[r] + g + 2 * q, 4);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr[k * (kNB / 2) + q], _mm256_set1_epi32(pair)));
          }
          const __m256 xb = _mm256_cvtepi32_ps(acc);  // each further block fused in: no contraction left to the compiler
          if (!bs[r]) x = xb;
          else x = k == 0 ? _mm256_mul_ps(xb, _mm256_set1_ps(bs[r][g])) : _mm256_fmadd_ps(xb, _mm256_set1_ps(bs[r][g]), x);
        }
        sum[r] = _mm256_fmadd_ps(x, dm, sum[r]);
      }
    }
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) _mm256_store_ps(corr[r][h], sum[r]);
  }
}

// corr[h][8] = sum over runs of dmin * (int32 sum over the run's groups of imin * code sum) for the H halves
// of one row (asum16: its int16 code sums, pairs zero-padded to whole runs; bs: with activation blocks, the row's
// scale per group, kNB groups a block (run_block_groups): each block's int32 sum converted, times its scale, the
// run's further blocks fused in (fma) in order, then times dmin). af (other blocks shorter than a run): the row's fp32 group code
// sums (already times their block scales), met by the imins as fp32, in group order.
template <int H, int kNB = kIMinRun>
void int_mins_term_ymm(const IntForms& f, const int16_t* asum16, const float* bs, const float* af, float (*corr)[8]) {
  if (af) {
    const int64_t pairs = (f.G + 1) / 2;
    _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
      const int64_t j = h / 2, c8 = (h % 2) * 8;
      __m256 sum = _mm256_setzero_ps();
      for (int64_t s = 0; s < f.runs; ++s) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t p = s * (kIMinRun / 2); p < std::min(pairs, (s + 1) * (kIMinRun / 2)); ++p) {
          const __m256i pr = imin_pair8(f.imn_pair(j, p) + 2 * c8);
          const __m256 ev = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(pr, 16), 16));
          const __m256 od = _mm256_cvtepi32_ps(_mm256_srai_epi32(pr, 16));
          acc = _mm256_fmadd_ps(ev, _mm256_set1_ps(af[2 * p]), acc);
          acc = _mm256_fmadd_ps(od, _mm256_set1_ps(2 * p + 1 < f.G ? af[2 * p + 1] : 0.f), acc);
        }
        sum = _mm256_fmadd_ps(acc, half8(f.dmn_run(j, s) + c8), sum);
      }
      _mm256_store_ps(corr[h], sum);
    }
    return;
  }
  int_mins_term_rows<1, kNB, H>(f, &asum16, &bs, reinterpret_cast<float (*)[H][8]>(corr));
}

// kBlk: A8 activation blocks (ActRows::bscale), instances of their own so that the per-token code stays as it was:
// 1 a block scale per group (blocks of the group length or longer), 2 pieces (blocks shorter than a group).
template <bool kInt4, IntDot D = IntDot::kMaddubs, Codes C = Codes::kPlain, int kBlk = 0>
struct IntAvx2 {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      constexpr int64_t step = kInt4 ? 8 : 4;
      constexpr int H = 2 * NJ;  // ymm halves (8 columns each)
      const int64_t G = a.G, gl = w.group_len(), Kp = a.Kp;  // a.G: w.num_groups() without a division
      const uint8_t* panel[NJ];
      for (int j = 0; j < NJ; ++j) panel[j] = w.panel(e, b + j);
      constexpr bool kA16 = D == IntDot::kMaddwd16;
      const int8_t* arow[MR];
      const int16_t* arow16[MR];
      for (int r = 0; r < MR; ++r) {
        if constexpr (kA16) arow16[r] = a.q16 + a.row_idx[r0 + r] * Kp;
        else arow[r] = a.q + a.row_idx[r0 + r] * Kp;
      }
      // code sums per group piece (A16, A8 blocks); A8 blocks: each piece's block scale in bsr
      const int64_t NP = kA16 || kBlk == 2 ? a.NP : 1, ps = kA16 ? kA16Piece / step : NP > 1 ? a.pk / step : Kp;
      [[maybe_unused]] const float* bsr[kBlk ? MR : 1] = {};
      if constexpr (kBlk != 0)
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) bsr[r] = a.bscale + a.row_idx[r0 + r] * G * NP;
      const __m256i even = _mm256_set1_epi16(0xff);
      const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(char(0x80));
      const __m256i table = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(C == Codes::kSigned ? (const void*)w.codebook : (const void*)w.code_table)));
      const __m256i abs_table = _mm256_abs_epi8(table);  // kSigned: |codebook|
      alignas(32) float accf[MR][H][8] = {};
      // Per-call constants in locals: the stores to accf would otherwise make the compiler reload them.
      const bool has_zeros = w.has_zeros, has_mins = w.has_mins;
      const float* scales = w.scales.as<float>();
      const float* mins = has_mins && !w.imin_groups ? w.mins.as<float>() : nullptr;
      const uint8_t* zeros = has_zeros ? w.zeros.data() : nullptr;
      const int32_t* asr[MR];  // each row's group code sums
      const float* asf[MR];
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
        asr[r] = a.asum + a.row_idx[r0 + r] * G * NP, asf[r] = has_mins ? a.asum_f32 + a.row_idx[r0 + r] * G : nullptr;
      // Integer scales and mins (int4 K-quant forms): row tiles read the fp32 values of this block from
      // a.blk_scales / a.blk_mins (int4_avx2_gemm builds them once per block); decode builds each group's
      // isc * d and imin * dmin here (the same floats: it reads 20 bytes per 32 codes, not 24).
      const IntForms forms(w, e, b, G);
      // Decode with integer mins: per run, the int32 sum of imin * code sum by vpmaddwd of pairs, times
      // dmin once (as int_mins_term on AVX-512): about 1.5 ops per group instead of 7 for fp32 mins. Only on
      // vpmaddubsw, whose row tiles on these forms are int_avx2_runs.h's (the same run term); the AVX-VNNI row
      // tiles here take fp32 mins per group, and so does their decode, so that a row's bits do not depend on the
      // rows beside it.
      alignas(32) float corr[MR == 1 ? H : 1][8];
      const bool run_mins = !kA16 && MR == 1 && kInt4 && has_mins && forms.imn && D == IntDot::kMaddubs;
      if (run_mins) {
        const bool f32_sums = kBlk != 0 && imins_f32(w);  // blocks shorter than a run
        int_mins_term_ymm<H>(forms, f32_sums ? nullptr : a.asum16 + a.row_idx[r0] * a.G2, bsr[0],
                             f32_sums ? a.asum_f32 + a.row_idx[r0] * G : nullptr, corr);
      }
      const int zc = has_zeros ? 0 : kInt4 ? (C == Codes::kSigned ? 0 : w.code_zero) : (D != IntDot::kMaddubs ? 128 : 0);
      NextGroupPrefetch<> pf(w, e, b, NJ, r0, MR, a.rows, Kp / step);
      const ScaleIndex sx(w, e, b, G);
      const GroupSidePrefetch side(w, forms, sx, false, run_mins ? NJ : -1);
      [[maybe_unused]] __m256 run_d[MR == 1 ? H : 1], run_dm[MR == 1 ? H : 1];  // decode: the run's d / dmin, widened
      for (int64_t gi = 0; gi < G; ++gi) {
        if constexpr (MR == 1) {
          side.at<NJ>(gi);
          if (gi % kIMinRun == 0)
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h)
              run_d[h] = forms.run_d(h / 2, gi, (h % 2) * 8), run_dm[h] = forms.run_dmin(h / 2, gi, (h % 2) * 8);
        }
        const int64_t g0 = gi * gl / step, g1 = gi == G - 1 ? Kp / step : (gi + 1) * gl / step;
       for (int64_t pi = 0; pi < NP; ++pi) {
        const int64_t s0 = g0 + pi * ps, s1 = pi == NP - 1 ? g1 : s0 + ps, ai = gi * NP + pi;
        // Without stored zeros the zero point's term (zc * group code sum) is the same for every column:
        // it starts the int32 sums, and the group ends without a per-column multiply.
        __m256i acc[MR][H];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
          const __m256i start = _mm256_set1_epi32(-zc * asr[r][ai]);
          _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) acc[r][h] = start;
        }
        // One k-step into acc (int4 with vpmaddubsw: into the int16 sums a16).
        [[maybe_unused]] __m256i a16[MR][H];
        const auto step_at = [&](int64_t t) __attribute__((always_inline)) {
          // decode streams weights from DRAM: each panel ahead into L2, and int8 nearer into L1 (Zen 4, paired: Q8_0
          // 0.834; int4 0.99-1.06, left out)
          if constexpr (MR == 1)
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
              _mm_prefetch((const char*)(panel[j] + t * 64 + (kInt4 ? kAvx2Int4PrefetchBytes : kDecodePrefetchBytes)), _MM_HINT_T1);
              if constexpr (!kInt4) _mm_prefetch((const char*)(panel[j] + t * 64 + kDecodeL1Bytes<false>), _MM_HINT_T0);
            }
          if constexpr (kA16) {
            // Per half, the int16 words w[q] (column lanes holding channels (k, k+2), (k+1, k+3) [, (k+4, k+6),
            // (k+5, k+7)]) meet the code pair at arow16 + t * step + 2q. Plain int4 codes come straight from
            // the nibbles (a 16-bit word holds k, k+4, k+1, k+5 from its low bits up); a codebook goes through
            // code_table bytes first. Halves one at a time: 16 ymm registers.
            constexpr int kW = kInt4 ? 4 : 2;
            const auto pair = [&](int r, int q) {
              int32_t p;
              std::memcpy(&p, arow16[r] + t * step + 2 * q, 4);
              return _mm256_set1_epi32(p);
            };
            __m256i bc[MR == 1 ? kW : 1];  // decode: the row's pairs, loaded once for every half
            if constexpr (MR == 1)
              _Pragma("GCC unroll 4") for (int q = 0; q < kW; ++q) bc[q] = pair(0, q);
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
              const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[h / 2] + t * 64 + (h % 2) * 32));
              __m256i w[kW];
              if constexpr (kInt4 && C == Codes::kPlain) {
                const __m256i m4 = _mm256_set1_epi16(0x000f);
                w[0] = _mm256_and_si256(v, m4), w[1] = _mm256_and_si256(_mm256_srli_epi16(v, 8), m4);
                w[2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), w[3] = _mm256_srli_epi16(v, 12);
              } else if constexpr (kInt4) {
                const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low4));
                const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
                w[0] = _mm256_and_si256(lo, even), w[1] = _mm256_srli_epi16(lo, 8);
                w[2] = _mm256_and_si256(hi, even), w[3] = _mm256_srli_epi16(hi, 8);
              } else {
                w[0] = _mm256_and_si256(v, even), w[1] = _mm256_srli_epi16(v, 8);
              }
              _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
                __m256i s = _mm256_madd_epi16(w[0], MR == 1 ? bc[0] : pair(r, 0));
                const __m256i s1 = _mm256_madd_epi16(w[1], MR == 1 ? bc[kW > 1 ? 1 : 0] : pair(r, 1));
                if constexpr (kW == 4)
                  s = _mm256_add_epi32(s, _mm256_madd_epi16(w[2], MR == 1 ? bc[kW - 2] : pair(r, 2))),
                  acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_add_epi32(s1, _mm256_madd_epi16(w[3], MR == 1 ? bc[kW - 1] : pair(r, 3))));
                acc[r][h] = _mm256_add_epi32(acc[r][h], kW == 4 ? s : _mm256_add_epi32(s, s1));
              }
            }
          } else if constexpr (D != IntDot::kMaddubs) {  // weights first, then one row's broadcasts at a time
            __m256i u[2 * H];                     // (int4: low nibbles, then high; 15 ymm live at H = 2)
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
              const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[h / 2] + t * 64 + (h % 2) * 32));
              u[h] = kInt4 ? _mm256_and_si256(v, low4) : v;
              if constexpr (kInt4) u[H + h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
              if constexpr (C == Codes::kTable) u[h] = _mm256_shuffle_epi8(table, u[h]), u[H + h] = _mm256_shuffle_epi8(table, u[H + h]);
            }
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
              int32_t a0;
              std::memcpy(&a0, arow[r] + t * step, 4);
              const __m256i b0 = _mm256_set1_epi32(a0);
              _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) dpbusd_ymm<D>(acc[r][h], u[h], b0);
              if constexpr (kInt4) {
                std::memcpy(&a0, arow[r] + t * 8 + 4, 4);
                const __m256i b1 = _mm256_set1_epi32(a0);
                _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) dpbusd_ymm<D>(acc[r][h], u[H + h], b1);
              }
            }
          } else if constexpr (kInt4 && C != Codes::kSigned && MR == 1) {
            // decode: one half at a time (the int16 sums of all H halves, two broadcasts and one half's codes
            // live; with every half's codes first, the sums spilled)
            int32_t a0, a1;
            std::memcpy(&a0, arow[0] + t * 8, 4);
            std::memcpy(&a1, arow[0] + t * 8 + 4, 4);
            const __m256i b0 = _mm256_set1_epi32(a0), b1 = _mm256_set1_epi32(a1);
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
              const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[h / 2] + t * 64 + (h % 2) * 32));
              __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
              if constexpr (C == Codes::kTable) lo = _mm256_shuffle_epi8(table, lo), hi = _mm256_shuffle_epi8(table, hi);
              a16[0][h] = _mm256_add_epi16(a16[0][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo, b0), _mm256_maddubs_epi16(hi, b1)));
            }
          } else if constexpr (kInt4 && C != Codes::kSigned) {
            // vpmaddubsw into the int16 sums: all halves' codes first, then one row's two broadcasts at a
            // time (with the broadcasts of every row live across the halves, the int16 sums spilled).
            __m256i lo[H], hi[H];
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
              const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[h / 2] + t * 64 + (h % 2) * 32));
              lo[h] = _mm256_and_si256(v, low4), hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
              if constexpr (C == Codes::kTable) lo[h] = _mm256_shuffle_epi8(table, lo[h]), hi[h] = _mm256_shuffle_epi8(table, hi[h]);
            }
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
              int32_t a0, a1;
              std::memcpy(&a0, arow[r] + t * 8, 4);
              std::memcpy(&a1, arow[r] + t * 8 + 4, 4);
              const __m256i b0 = _mm256_set1_epi32(a0), b1 = _mm256_set1_epi32(a1);
              _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
                a16[r][h] = _mm256_add_epi16(a16[r][h], _mm256_maddubs_epi16(lo[h], b0));
                a16[r][h] = _mm256_add_epi16(a16[r][h], _mm256_maddubs_epi16(hi[h], b1));
              }
            }
          } else {  // vpmaddubsw + vpmaddwd
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
              const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[h / 2] + t * 64 + (h % 2) * 32));
              if constexpr (kInt4 && C == Codes::kSigned) {
                const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                const __m256i slo = _mm256_shuffle_epi8(table, lo), shi = _mm256_shuffle_epi8(table, hi);
                const __m256i alo = _mm256_shuffle_epi8(abs_table, lo), ahi = _mm256_shuffle_epi8(abs_table, hi);
                _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
                  int32_t a0, a1;
                  std::memcpy(&a0, arow[r] + t * 8, 4);
                  std::memcpy(&a1, arow[r] + t * 8 + 4, 4);
                  const __m256i p0 = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(_mm256_set1_epi32(a0), slo));
                  const __m256i p1 = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(_mm256_set1_epi32(a1), shi));
                  acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones)));
                }
              } else {
                const __m256i sw = _mm256_xor_si256(v, flip), aw = _mm256_abs_epi8(sw);
                _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
                  int32_t a0;
                  std::memcpy(&a0, arow[r] + t * 4, 4);
                  const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(a0), sw));
                  acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(p, ones));
                }
              }
            }
          }
        };
        if constexpr (kInt4 && D == IntDot::kMaddubs && C != Codes::kSigned) {
          // int16 sums of kChunk k-steps (each adds 4 products to a lane: 16 codes <= 15, or 8 table bytes <= 31,
          // times 127 < 2^15), then one vpmaddwd.
          constexpr int kChunk = C == Codes::kTable ? 2 : 4;
          if (MR == 1 && s1 - s0 == kChunk) {  // decode, a group of 32 codes (the GGUF forms): one chunk, unrolled
            // (outside the chunk loop: inside it, hot decode ran 1.09-1.11x slower)
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) a16[0][h] = _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int q = 0; q < kChunk; ++q) step_at(s0 + q);
            _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) acc[0][h] = _mm256_add_epi32(acc[0][h], _mm256_madd_epi16(a16[0][h], ones));
          } else if (MR == 1 && s1 - s0 == 2 * kChunk) {  // decode, two chunks (MXFP4's table bytes in groups of 32)
            _Pragma("GCC unroll 2") for (int ch = 0; ch < 2; ++ch) {
              _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) a16[0][h] = _mm256_setzero_si256();
              _Pragma("GCC unroll 4") for (int q = 0; q < kChunk; ++q) step_at(s0 + ch * kChunk + q);
              _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) acc[0][h] = _mm256_add_epi32(acc[0][h], _mm256_madd_epi16(a16[0][h], ones));
            }
          } else
          for (int64_t q0 = s0; q0 < s1; q0 += kChunk) {
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
              _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) a16[r][h] = _mm256_setzero_si256();
            for (int64_t t = q0, q1 = std::min(s1, q0 + kChunk); t < q1; ++t) {
              if constexpr (MR > 1) pf.step();
              step_at(t);
            }
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
              _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h)
                acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(a16[r][h], ones));
          }
        } else {
          // int4 decode with vpdpbusd / vpmaddwd: groups of 32 / 64 codes unrolled (AVX-VNNI hot decode 0.94-0.96;
          // the vpmaddubsw kSigned loop was 3% slower so)
          group_steps<!kInt4 || (MR == 1 && D != IntDot::kMaddubs), (MR > 1)>(pf, s0, s1, step_at);
        }
        _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
          const int64_t si = sx(h / 2, gi) + (h % 2) * 8;
          const int64_t j = h / 2, c8 = (h % 2) * 8;
          const __m256 sv = MR == 1 ? forms.scales(a.blk_scales, j, gi, c8, scales, si, run_d[MR == 1 ? h : 0])
                                    : forms.scales(a.blk_scales, j, gi, c8, scales, si);
          const bool zp = kInt4 && has_zeros;  // stored zero points: per column
          const __m256i zv = zp ? _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros + si)))
                                : _mm256_setzero_si256();
          const bool group_mins = has_mins && !run_mins;
          const __m256 mv = !group_mins ? _mm256_setzero_ps()
                            : MR == 1   ? forms.mins(a.blk_mins, j, gi, c8, mins, si, run_dm[MR == 1 ? h : 0])
                                        : forms.mins(a.blk_mins, j, gi, c8, mins, si);
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            __m256i exact = acc[r][h];
            if (zp) exact = _mm256_sub_epi32(exact, _mm256_mullo_epi32(zv, _mm256_set1_epi32(asr[r][ai])));
            __m256 x = _mm256_cvtepi32_ps(exact);
            if constexpr (kBlk != 0) x = _mm256_mul_ps(x, _mm256_set1_ps(bsr[r][ai]));
            __m256 f = _mm256_fmadd_ps(x, sv, _mm256_load_ps(accf[r][h]));
            if (group_mins && pi == NP - 1) f = _mm256_fnmadd_ps(mv, _mm256_broadcast_ss(asf[r] + gi), f);
            _mm256_store_ps(accf[r][h], f);
          }
        }
       }
      }
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
        const __m256 rs = _mm256_set1_ps(a.scale[a.row_idx[r0 + r]]);
        for (int h = 0; h < H; ++h) {
          const int n0 = (h % 2) * 8, valid = valid_cols(w, b + h / 2) - n0;
          float* dst = c + (r0 + r) * ldc + (h / 2) * 16 + n0;
          alignas(32) float tmp[8];
          __m256 v = _mm256_load_ps(accf[r][h]);
          if (run_mins) v = _mm256_sub_ps(v, _mm256_load_ps(corr[MR == 1 ? h : 0]));
          _mm256_store_ps(tmp, _mm256_mul_ps(v, rs));
          if (valid >= 8) std::memcpy(dst, tmp, 32);
          else if (valid > 0) std::memcpy(dst, tmp, size_t(valid) * 4);
        }
      }
    }
  };
};

// Row tiles for short scale groups on the vpmaddubsw tier (int_avx2_g32.h, which a kernel file using
// IntDot::kMaddubs includes), kG32Rows rows each.
template <bool kInt4, Codes C, int kBlk, int P, int kF, int kSum = 1> struct IntAvx2G32;
template <bool kInt4, Codes C, int kBlk, int P>
void drive_g32(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc);
template <template <int, int> class Micro, int R>
void drive_even(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc);
constexpr int kG32Rows = 8;
// kQwordTable's largest code_table byte: two vpmaddubsw outputs add exactly in int16 (4 * 64 * 127 < 2^15).
constexpr int kQwordTableTop = 64;
// Whether a GEMM's row tiles read integer scales / mins from a per-block fp32 scratch: three tiles a block or more.
// With one or two (M = 128: ~8 rows an expert) each tile widens them per group itself.
inline bool block_scratch_pays(const ActRows& a) { return a.rows > 2 * kG32Rows; }
inline bool int4_g32_fits(const PackedExperts& w, const ActRows& a, Codes c);
inline int int8_g32_passes(const PackedExperts& w, const ActRows& a);
template <int NJ, int ND>
void int8_avx2_g32_gemm(int P, const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                        int64_t ldc);
template <int kBlk, bool kSigned>
void int4_qword_decode(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c);  // int_avx2_g32.h
// Whether an int4 GEMM on plain codes runs int_avx2_runs.h's kernels: qword panels with integer scales, integer mins
// or none, no zero point, and activation blocks of whole pairs of groups (run_block_groups), or per token.
inline bool int4_runs_fit(const PackedExperts& w, const ActRows& a) {
  return w.qword_panels && w.iscale_groups == kIMinRun && (!w.has_mins || w.imin_groups) && !w.has_zeros &&
         w.code_zero == 0 && (!a.bscale || (a.NP == 1 && run_block_groups(w) != 0));
}
template <int kBlk>
void int4_qword_runs(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc);

// The int4 GEMM of dot D with codes C: groups of 32 in IntAvx2G32's row tiles where they fit, else IntAvx2.
template <IntDot D, Codes C, int MR, int NJ, int ND, int kBlk>
void int4_avx2_code_form_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                              int64_t ldc) {
  if constexpr (D == IntDot::kMaddubs && kBlk <= 1 && (C == Codes::kPlain || C == Codes::kSigned))
    if (w.qword_panels) {  // (derive_qword_panels: groups of 32 (16: kSigned) along K, so row tiles fit IntAvx2G32's)
      constexpr bool kS = C == Codes::kSigned;
      if constexpr (!kS)
        if (int4_runs_fit(w, a)) return int4_qword_runs<kBlk>(w, e, b0, b1, a, c, ldc);
      if (a.rows == 1) return int4_qword_decode<kBlk, kS>(w, e, b0, b1, a, c);
      if constexpr (kS) {
        const bool table = code_table_top(w) <= kQwordTableTop;  // unsigned bytes: no sign to move
        if (w.group_len() == 16)
          return table ? drive_g32<true, Codes::kQwordTable, kBlk, 1>(w, e, b0, b1, a, c, ldc)
                       : drive_g32<true, Codes::kQwordSigned, kBlk, 1>(w, e, b0, b1, a, c, ldc);
        if (table) return drive_g32<true, Codes::kQwordTable, kBlk, 2>(w, e, b0, b1, a, c, ldc);
      }
      return drive_g32<true, kS ? Codes::kQwordSigned : Codes::kQword, kBlk, 2>(w, e, b0, b1, a, c, ldc);
    }
  if constexpr (D == IntDot::kMaddubs && kBlk <= 1)
    if (int4_g32_fits(w, a, C)) {
      if constexpr (C == Codes::kSigned || C == Codes::kTable)  // groups of 16 (small codes): |codebook| tiles
        if (w.group_len() == 16) return drive_g32<true, Codes::kSigned, kBlk, 1>(w, e, b0, b1, a, c, ldc);
      if constexpr (C != Codes::kTable) return drive_g32<true, C, kBlk, 2>(w, e, b0, b1, a, c, ldc);
    }
  if (w.qword_panels)  // (activation blocks shorter than a group of 32 do not exist: a guard, not a path)
    throw std::logic_error("int4 qword panels reached a kernel path without them");
  drive<IntAvx2<true, D, C, kBlk>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}

// The int4 GEMM of dot D: codes as stored, or mapped through the codebook (kSigned when vpmaddubsw
// would saturate on code_table bytes > 31).
template <IntDot D>
Codes int4_codes(const PackedExperts& w) {
  if (!w.code_shuffle) return Codes::kPlain;
  return D != IntDot::kMaddubs || code_table_top(w) <= 31 ? Codes::kTable : Codes::kSigned;
}
template <IntDot D, int MR, int NJ, int ND, int kBlk>
void int4_avx2_codes_gemm_as(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                             int64_t ldc) {
  switch (int4_codes<D>(w)) {
    case Codes::kPlain: return int4_avx2_code_form_gemm<D, Codes::kPlain, MR, NJ, ND, kBlk>(w, e, b0, b1, a, c, ldc);
    case Codes::kTable: return int4_avx2_code_form_gemm<D, Codes::kTable, MR, NJ, ND, kBlk>(w, e, b0, b1, a, c, ldc);
    default: return int4_avx2_code_form_gemm<D, Codes::kSigned, MR, NJ, ND, kBlk>(w, e, b0, b1, a, c, ldc);
  }
}
template <IntDot D, int MR, int NJ, int ND>
void int4_avx2_codes_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                          int64_t ldc) {
  if constexpr (D != IntDot::kMaddwd16)  // A8: activation blocks or not
    if (a.bscale)
      return a.NP > 1 ? int4_avx2_codes_gemm_as<D, MR, NJ, ND, 2>(w, e, b0, b1, a, c, ldc)
                      : int4_avx2_codes_gemm_as<D, MR, NJ, ND, 1>(w, e, b0, b1, a, c, ldc);
  int4_avx2_codes_gemm_as<D, MR, NJ, ND, 0>(w, e, b0, b1, a, c, ldc);
}

// Column block b's fp32 scales and / or mins ([G][16] each; nullptr: not wanted), from where the weights hold them:
// the scratch that row tiles read through ActRows::blk_scales / blk_mins.
inline void store_block_forms(const PackedExperts& w, int64_t e, int64_t b, int64_t G, float* scales_out,
                              float* mins_out) {
  const IntForms forms(w, e, b, G);
  const ScaleIndex sx(w, e, b, G);
  const float* scales = w.scales.as<float>();
  const float* mins = w.has_mins && !w.imin_groups ? w.mins.as<float>() : nullptr;
  for (int64_t gi = 0; gi < G; ++gi)
    for (int c8 = 0; c8 < 16; c8 += 8) {
      if (scales_out) _mm256_store_ps(scales_out + gi * 16 + c8, forms.scales(nullptr, 0, gi, c8, scales, sx(0, gi) + c8));
      if (mins_out) _mm256_store_ps(mins_out + gi * 16 + c8, forms.mins(nullptr, 0, gi, c8, mins, sx(0, gi) + c8));
    }
}

// With integer scales or mins, row tiles take each column block's fp32 values from a scratch built once
// per block (per row tile they would cost as much as a quarter of a group's k-steps); decode builds them
// inline, and so do IntAvx2G32's tiles where a block has one or two (M = 128: ~8 rows an expert), or one on qword
// panels.
template <IntDot D, int MR, int NJ, int ND>
void int4_avx2_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                    int64_t ldc) {
  static_assert(NJ == 1, "one column block per row tile");
  if (a.rows == 1 || !(w.iscale_groups || w.imin_groups) ||
      (D == IntDot::kMaddubs && ((!block_scratch_pays(a) && int4_g32_fits(w, a, int4_codes<D>(w))) ||
                                 (w.qword_panels && a.rows <= kG32Rows) ||  // one row tile a block: inline
                                 (int4_codes<D>(w) == Codes::kPlain && int4_runs_fit(w, a)))))
    return int4_avx2_codes_gemm<D, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  const int64_t G = a.G;
  std::vector<float> buf(size_t(2 * G * 16) + 8);
  float* blk = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 31) & ~uintptr_t(31));
  ActRows ab = a;
  float* blk_mins = w.has_mins ? blk + G * 16 : nullptr;
  ab.blk_scales = blk, ab.blk_mins = blk_mins;
  for (int64_t b = b0; b < b1; ++b) {
    store_block_forms(w, e, b, G, blk, blk_mins);
    int4_avx2_codes_gemm<D, MR, NJ, ND>(w, e, b, b + 1, ab, c + (b - b0) * 16, ldc);
  }
}

// The int8 GEMM of dot D (A8: per token or with activation blocks, A16) on int8 panels; groups of 16 or 32 in
// IntAvx2G32's row tiles (split 5- / 6-bit codes: int8_avx2_codes_gemm in int_avx2_split.h). Integer scales
// (Q6_K, Q5_K): every tile widens them per group (one row tile per block is common: M = 128
// has ~8 rows per expert, where a scratch per block cost Q5_K 9%).
template <IntDot D, int MR, int NJ, int ND>
void int8_avx2_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if constexpr (D == IntDot::kMaddubs) {
    if (w.split_bits) throw std::logic_error("split 5- / 6-bit codes reached int8_avx2_gemm (int_avx2_split.h)");
    if (const int P = int8_g32_passes(w, a)) return int8_avx2_g32_gemm<NJ, ND>(P, w, e, b0, b1, a, c, ldc);
  }
  if constexpr (D != IntDot::kMaddwd16)
    if (a.bscale)
      return a.NP > 1 ? drive<IntAvx2<false, D, Codes::kPlain, 2>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc)
                      : drive<IntAvx2<false, D, Codes::kPlain, 1>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  drive<IntAvx2<false, D>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}

MOE_ISA_END
