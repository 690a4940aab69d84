// A design study, not library code: the AVX2 Q4_K row tile against 256-blocks of activations (ggml's Q8_K), with
// the groups' integer scales inside the vpmaddwd that widens each group's int16 sums (as ik_llama.cpp's Q4_K_R4
// loop does), an int32 sum per row and run of 8 groups, and one fp32 epilogue per run. Each row's group is the
// library's qword_group (kernels/int_avx2_g32.h) with the scales in place of its vector of ones; 8 rows; the mins
// term left out (an integer sum per run). bench/studies/tile_mca.py compiles it and runs its group loop under llvm-mca
// beside the library's tiles (docs/performance.md, issue 40).
#define MOE_ISA avx2  // kernels/isa.h
#include <immintrin.h>

#include <cstdint>

#include "kernels/int_avx2_g32.h"

MOE_ISA_BEGIN

// panel: qword panels of 16 columns (two halves of 8); arow: the rows' int8 activations; sc8: uint8 scales,
// [group][16 columns]; dh: fp16 d, [run][16 columns]; bs: the rows' block scales, one a run; out: [8][16].
__attribute__((noinline)) void g32_run256_tile(const uint8_t* panel, const int8_t* const* arow, const uint8_t* sc8,
                                               const uint16_t* dh, const float* const* bs, int runs, float* out) {
  constexpr int kRows = 8;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
    for (int run = 0; run < runs; ++run) {
      __m256i isum[kRows];
      for (int r = 0; r < kRows; ++r) isum[r] = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const int gi = run * 8 + g;
        const uint8_t* pg = panel + h * 32 + gi * 256;
        __m256i lo[4], hi[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64));
          lo[t] = _mm256_and_si256(v, low4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        // each column's scale in both int16 halves of its int32 lane (columns in order after vphaddw)
        const __m256i s32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc8 + gi * 16 + h * 8)));
        const __m256i s16 = _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16));
        // <= 63 * 2 * 16 * 15 * 127 a group, 8 groups: < 2^31
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) isum[r] = _mm256_add_epi32(isum[r], qword_group(lo, hi, arow[r] + gi * 32, s16));
      }
      const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh + run * 16 + h * 8)));
      for (int r = 0; r < kRows; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, _mm256_broadcast_ss(bs[r] + run)), acc[r]);
    }
    for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(out + r * 16 + h * 8, acc[r]);
  }
}

MOE_ISA_END
