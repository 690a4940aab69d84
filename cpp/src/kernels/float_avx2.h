// float_avx2.h — the shared microkernel of bf16_avx2 and fp8w_avx2: weights widened to fp32 in
// registers, fp32 FMA against broadcast activations. One panel row holds 16 columns x 2 k; each
// 32-bit lane is one column's (k, k+1) pair as bf16, so k is lane << 16 and k+1 is lane & 0xffff0000.
// fp8: 16 codes -> 16 bf16 words (exponent + 120, mantissa moved up; subnormals from a vpshufb
// table of m * 2^-9), then the same split; K-block sums are scaled per column.
// Needs: AVX2, FMA. Tile: MR rows x 16 columns per block.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "common/layout.h"
#include "kernels/tile_driver.h"

namespace moe_cpu::kernels {

// 8 columns x 2 k of e4m3fn codes (16 bytes) -> 8 lanes of bf16 pairs, exact.
inline __m256i e4m3_pairs_to_bf16(__m128i codes) {
  const __m256i c = _mm256_cvtepu8_epi16(codes);
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7f));
  const __m256i normal = _mm256_add_epi16(_mm256_slli_epi16(mag, 4), _mm256_set1_epi16(0x3c00));
  // bf16 of m * 2^-9, m = 0..7: low bytes and high bytes looked up separately.
  const __m256i lo_lut = _mm256_setr_epi8(0, 0, char(0x80), char(0xc0), 0, 0x20, 0x40, 0x60, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0, char(0x80), char(0xc0), 0, 0x20, 0x40, 0x60, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i hi_lut = _mm256_setr_epi8(0, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0, 0, 0, 0, 0, 0, 0, 0,
                                          0, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i idx = _mm256_or_si256(_mm256_and_si256(mag, _mm256_set1_epi16(7)), _mm256_set1_epi16(short(0x8000)));
  const __m256i sub = _mm256_or_si256(_mm256_shuffle_epi8(lo_lut, idx), _mm256_slli_epi16(_mm256_shuffle_epi8(hi_lut, idx), 8));
  const __m256i is_sub = _mm256_cmpgt_epi16(_mm256_set1_epi16(8), mag);
  const __m256i bf = _mm256_blendv_epi8(normal, sub, is_sub);
  return _mm256_or_si256(bf, _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8));
}

template <bool kFp8>
struct FloatAvx2 {
  template <int MR, int NJ>
  struct Micro {
    static void run(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                    int64_t ldc) {
      constexpr int H = 2 * NJ;
      const int64_t G = kFp8 ? w.num_groups() : 1, gl = w.group_len(), Kp = a.Kp;
      const uint8_t* panel[NJ];
      for (int j = 0; j < NJ; ++j) panel[j] = w.panel(e, b + j);
      const uint16_t* arow[MR];
      for (int r = 0; r < MR; ++r) arow[r] = a.bf16 + a.row_idx[r0 + r] * Kp;
      const __m256i hi_mask = _mm256_set1_epi32(int(0xffff0000u));
      alignas(32) float accf[MR][H][8] = {};
      NextGroupPrefetch<> pf(w, e, b, NJ, r0, MR, a.rows, Kp / 2);
      const ScaleIndex sx(w, e, b);
      for (int64_t gi = 0; gi < G; ++gi) {
        const int64_t s0 = gi * gl / 2, s1 = gi == G - 1 ? Kp / 2 : (gi + 1) * gl / 2;
        __m256 acc[MR][H];
        _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
          _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) acc[r][h] = _mm256_setzero_ps();
        for (int64_t t = s0; t < s1; ++t) {
          if constexpr (MR > 1) pf.step();
          __m256 a0[MR], a1[MR];
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r) {
            uint32_t pair;
            std::memcpy(&pair, arow[r] + 2 * t, 4);
            a0[r] = _mm256_set1_ps(bits_of(pair << 16));
            a1[r] = _mm256_set1_ps(bits_of(pair & 0xffff0000u));
          }
          _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
            __m256i v;
            if constexpr (kFp8) v = e4m3_pairs_to_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(panel[h / 2] + t * 32 + (h % 2) * 16)));
            else v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[h / 2] + t * 64 + (h % 2) * 32));
            const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            const __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
            _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
              acc[r][h] = _mm256_fmadd_ps(w1, a1[r], _mm256_fmadd_ps(w0, a0[r], acc[r][h]));
          }
        }
        _Pragma("GCC unroll 16") for (int h = 0; h < H; ++h) {
          const __m256 sv = kFp8 ? _mm256_load_ps(w.scales.as<float>() + sx(h / 2, gi) + (h % 2) * 8)
                                 : _mm256_set1_ps(1.f);
          _Pragma("GCC unroll 16") for (int r = 0; r < MR; ++r)
            _mm256_store_ps(accf[r][h], _mm256_fmadd_ps(acc[r][h], sv, _mm256_load_ps(accf[r][h])));
        }
      }
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < H; ++h) {
          const int n0 = (h % 2) * 8, valid = valid_cols(w, b + h / 2) - n0;
          if (valid > 0) std::memcpy(c + (r0 + r) * ldc + (h / 2) * 16 + n0, accf[r][h], size_t(valid < 8 ? valid : 8) * 4);
        }
    }
    static float bits_of(uint32_t u) {
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
  };
};

}  // namespace moe_cpu::kernels
