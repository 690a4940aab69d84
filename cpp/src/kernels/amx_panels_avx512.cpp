// amx_panels_avx512.cpp — the AMX kernels' int4 and fp8 B tiles with AVX-512 (amx_panels.h): per 64-byte
// int4 panel row, two AND / shift (and with a codebook two vpshufb) give the two int8 tile rows; per 64
// e4m3 codes, E4m3Vbmi's five byte permutes give 64 bf16.
// Needs: AVX512F, AVX512BW (int4), AVX512_VBMI (fp8); called only by the amx kernels, which need them.
#define MOE_ISA amx  // kernels/isa.h: this file's ISA region
#include <immintrin.h>

#include "kernels/amx_panels.h"
#include "kernels/float_avx512bf16.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

void widen_int4_avx512(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t Kt, uint8_t* dst) {
  const int64_t rows = w.padded_k() / 8;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.code_table)));
  for (int64_t j = 0; j < nj; ++j) {
    const uint8_t* src = w.panel(e, b + j);
    uint8_t* d = dst + j * Kt * 16;
    for (int64_t t = 0; t < rows; ++t) {
      const __m512i v = _mm512_load_si512(src + t * 64);
      __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      if (w.code_shuffle) lo = _mm512_shuffle_epi8(table, lo), hi = _mm512_shuffle_epi8(table, hi);
      _mm512_storeu_si512(d + 2 * t * 64, lo);
      _mm512_storeu_si512(d + 2 * t * 64 + 64, hi);
    }
    std::memset(d + rows * 128, 0, size_t(Kt * 16 - rows * 128));
  }
}

void decode_fp8_avx512(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t Kt, uint16_t* dst) {
  const E4m3Vbmi dec;
  const int64_t n = w.padded_k() / 2 * 32;  // codes per panel (a multiple of 32)
  for (int64_t j = 0; j < nj; ++j) {
    const uint8_t* src = w.panel(e, b + j);
    uint16_t* d = dst + j * Kt * 16;
    for (int64_t i = 0; i < n; i += 64) {
      const __mmask64 m = n - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (n - i)) - 1;
      __m512i w0, w1;
      dec.decode(_mm512_maskz_loadu_epi8(m, src + i), w0, w1);
      _mm512_storeu_si512(d + i, w0);
      if (n - i > 32) _mm512_storeu_si512(d + i + 32, w1);
    }
    std::fill(d + n, d + Kt * 16, uint16_t(0));
  }
}

MOE_ISA_END
