// float_avx512bf16.h — the shared microkernel of bf16_avx512bf16 and fp8w_avx512bf16.
// Per k-pair, one panel row gives 16 columns x 2 weights as bf16 (bf16: the 64 stored bytes;
// fp8: 32 e4m3 codes widened and decoded to bf16 in registers), and vdpbf16ps adds the two
// products against an activation pair broadcast per row. fp8 sums each K-block in fp32 and
// multiplies by the block scale of each column before adding it to the running fp32 sum.
// Needs: AVX512F, AVX512BW, AVX512_BF16; E4m3Vbmi also AVX512_VBMI (compile this header's users
// with those flags only).
#pragma once
#include <immintrin.h>

#include <cstring>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// acc += a.even * b.even + a.odd * b.odd (bf16 pairs); inline asm keeps the accumulator in place.
inline void dpbf16(__m512& acc, __m512i w, __m512i a) {
  asm("vdpbf16ps %[a], %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [a] "v"(a));
}

// The same with the activation pair at p broadcast by the instruction's own load ({1to16}).
inline void dpbf16_bcast(__m512& acc, __m512i w, const uint16_t* p) {
  asm("vdpbf16ps %[m]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [m] "m"(*reinterpret_cast<const int32_t*>(p)));
}

// acc[j] += w[j] . (the bf16 pair at p) for the NJ panels of one row. kShare (row tiles with NJ >= 2):
// the pair broadcast once into a register for every panel; the {1to16} form loads it per vdpbf16ps,
// and those loads bound the tile. Else {1to16}: decode tiles (one row) and one-panel tiles.
template <bool kShare, int NJ>
inline __attribute__((always_inline)) void dpbf16_row(__m512 (&acc)[NJ], const __m512i (&w)[NJ], const uint16_t* p) {
  if constexpr (kShare) {
    int32_t pair;
    std::memcpy(&pair, p, 4);
    const __m512i av = _mm512_set1_epi32(pair);
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dpbf16(acc[j], w[j], av);
  } else {
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dpbf16_bcast(acc[j], w[j], p);
  }
}

inline int32_t load_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// e4m3fn codes -> bf16 bits, exact. Normal codes: exponent + 120 and the 3 mantissa bits moved up;
// subnormal codes (exponent field 0) come from a table of m * 2^-9.
inline __m512i e4m3_to_bf16(__m256i codes) {
  const __m512i c = _mm512_cvtepu8_epi16(codes);
  const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi16(0x7f));
  __m512i bf = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(0x3c00));
  const __mmask32 sub = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
  const __m512i table = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  // words 0..7: 0, 2^-9 .. 7*2^-9
                                         0x3c603c40, 0x3c203c00, 0x3bc03b80, 0x3b000000);
  bf = _mm512_mask_permutexvar_epi16(bf, sub, mag, table);
  return _mm512_or_si512(bf, _mm512_slli_epi16(_mm512_and_si512(c, _mm512_set1_epi16(0x80)), 8));
}

// bf16 bits of the e4m3fn magnitude code `mag` (7 bits; 0x7f is NaN, rejected at pack time).
constexpr uint16_t e4m3_magnitude_bf16(int mag) {
  const int e = mag >> 3, m = mag & 7;
  if (mag == 0x7f || mag == 0) return 0;
  if (e > 0) return uint16_t((e + 120) << 7 | m << 4);
  int p = 2;  // subnormal m * 2^-9 = 1.f * 2^(p - 9), p = the top set bit of m
  while (!(m >> p)) --p;
  return uint16_t((118 + p) << 7 | ((m << (7 - p)) & 0x7f));
}

// Byte tables for the AVX512_VBMI decode: low and high bytes of every magnitude's bf16 bits, and
// the byte indices that interleave 32 low bytes with 32 high bytes into 32 words.
struct alignas(64) E4m3Tables {
  uint8_t lo[128], hi[128], even[64], odd[64];
};
constexpr E4m3Tables make_e4m3_tables() {
  E4m3Tables t{};
  for (int i = 0; i < 128; ++i) t.lo[i] = uint8_t(e4m3_magnitude_bf16(i)), t.hi[i] = uint8_t(e4m3_magnitude_bf16(i) >> 8);
  for (int j = 0; j < 32; ++j) {
    t.even[2 * j] = uint8_t(j), t.even[2 * j + 1] = uint8_t(64 + j);
    t.odd[2 * j] = uint8_t(32 + j), t.odd[2 * j + 1] = uint8_t(96 + j);
  }
  return t;
}
inline constexpr E4m3Tables kE4m3Tables = make_e4m3_tables();

// 64 e4m3fn codes (two k-steps of a panel) -> two vectors of 32 bf16, exact, in 5 instructions:
// two 128-byte table lookups (vpermt2b ignores the sign bit of the index), the sign ORed into the
// high bytes, and two byte interleaves.
struct E4m3Vbmi {
  __m512i lo0, lo1, hi0, hi1, even, odd, sign;
  E4m3Vbmi()
      : lo0(_mm512_load_si512(kE4m3Tables.lo)), lo1(_mm512_load_si512(kE4m3Tables.lo + 64)),
        hi0(_mm512_load_si512(kE4m3Tables.hi)), hi1(_mm512_load_si512(kE4m3Tables.hi + 64)),
        even(_mm512_load_si512(kE4m3Tables.even)), odd(_mm512_load_si512(kE4m3Tables.odd)),
        sign(_mm512_set1_epi8(char(0x80))) {}
  void decode(__m512i codes, __m512i& w0, __m512i& w1) const {
    const __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, codes, hi1), codes, sign, 0xf8);
    w0 = _mm512_permutex2var_epi8(lo, even, hi);
    w1 = _mm512_permutex2var_epi8(lo, odd, hi);
  }
};

// kFp8: weights are e4m3 codes; kVbmi: decoded with E4m3Vbmi two k-steps at a time.
template <bool kFp8, bool kVbmi = false>
struct FloatBf16 {
  static constexpr int64_t kRow = kFp8 ? 32 : 64, kPrefetchBytes = 4096;  // panel row bytes; prefetch distance
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      constexpr bool kShare = MR > 1 && NJ >= 2;  // see dpbf16_row
      const int64_t G = kFp8 ? w.num_groups() : 1, gl = w.group_len(), Kp = a.Kp;
      const uint8_t* panel[NJ];
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) panel[j] = w.panel(e, b + j);
      const uint16_t* arow[MR];
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) arow[r] = a.bf16 + a.row_idx[r0 + r] * Kp;
      [[maybe_unused]] const auto dec = [] {
        if constexpr (kVbmi) return E4m3Vbmi();
        else return 0;
      }();
      __m512 accf[MR][NJ];
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
        _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) accf[r][j] = _mm512_setzero_ps();
      NextGroupPrefetch<> pf(w, e, b, NJ, r0, MR, a.rows, kVbmi ? Kp / 4 : Kp / 2);
      const ScaleIndex sx(w, e, b);
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t s0 = gi * gl / 2, s1 = gi == G - 1 ? Kp / 2 : (gi + 1) * gl / 2;
        __m512 acc[MR][NJ];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) acc[r][j] = _mm512_setzero_ps();
        int64_t t = s0;
        if constexpr (kVbmi) {
          for (; t + 1 < s1; t += 2) {
            if constexpr (MR > 1) pf.step();
            if constexpr (MR == 1)
              _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) _mm_prefetch((const char*)(panel[j] + t * kRow + kPrefetchBytes), _MM_HINT_T1);
            __m512i w0[NJ], w1[NJ];
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) dec.decode(_mm512_loadu_si512(panel[j] + t * 32), w0[j], w1[j]);
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
              dpbf16_row<kShare>(acc[r], w0, arow[r] + 2 * t), dpbf16_row<kShare>(acc[r], w1, arow[r] + 2 * t + 2);
          }
        }
        for (; t < s1; ++t) {  // (VBMI: a group's odd last k-step)
          if constexpr (MR > 1 && !kVbmi) pf.step();
          if constexpr (MR == 1)  // decode streams weights from DRAM; larger tiles reuse them from L2
            _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) _mm_prefetch((const char*)(panel[j] + t * kRow + kPrefetchBytes), _MM_HINT_T1);
          __m512i wv[NJ];
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
            if constexpr (kFp8) wv[j] = e4m3_to_bf16(_mm256_load_si256(reinterpret_cast<const __m256i*>(panel[j] + t * 32)));
            else wv[j] = _mm512_load_si512(panel[j] + t * 64);
          }
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            if constexpr (kFp8) dpbf16_row<kShare>(acc[r], wv, arow[r] + 2 * t);
            else dpbf16_row<kShare>(accf[r], wv, arow[r] + 2 * t);
          }
        }
        if constexpr (kFp8) {
          _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
            const __m512 sv = _mm512_load_ps(w.scales.as<float>() + sx(j, gi));
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) accf[r][j] = _mm512_fmadd_ps(acc[r][j], sv, accf[r][j]);
          }
        }
      }
      _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
        const __mmask16 m = __mmask16((1u << valid_cols(w, b + j)) - 1);
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(c + (r0 + r) * ldc + 16 * j, m, accf[r][j]);
      }
    }
  };
};

MOE_ISA_END
