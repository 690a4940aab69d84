// transpose8x8.h — 8x8 byte transposes (SSE2) for gathering 8 activation rows through a channel
// permutation (act-order): channel-major words, so each permutation index moves one 8-byte word.
#pragma once
#include <cstdint>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace moe_cpu {

#if defined(__SSE2__)
// 8x8 byte transpose of the rows' bytes [k, k + 8) into t[0..8): t[c] byte r = rows[r][k + c].
inline void transpose8x8_regs(const __m128i in[8], __m128i out[4]) {
  const __m128i a0 = _mm_unpacklo_epi8(in[0], in[1]), a1 = _mm_unpacklo_epi8(in[2], in[3]);
  const __m128i a2 = _mm_unpacklo_epi8(in[4], in[5]), a3 = _mm_unpacklo_epi8(in[6], in[7]);
  const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
  const __m128i c0 = _mm_unpacklo_epi16(a2, a3), c1 = _mm_unpackhi_epi16(a2, a3);
  out[0] = _mm_unpacklo_epi32(b0, c0), out[1] = _mm_unpackhi_epi32(b0, c0);
  out[2] = _mm_unpacklo_epi32(b1, c1), out[3] = _mm_unpackhi_epi32(b1, c1);
}
inline void transpose8x8(const int8_t* const rows[8], int64_t k, uint64_t* t) {
  __m128i in[8], out[4];
  for (int r = 0; r < 8; ++r) in[r] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[r] + k));
  transpose8x8_regs(in, out);
  for (int i = 0; i < 4; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(t + 2 * i), out[i]);
}
// The way back, reading the words t[perm[0..8)]: rows[r][j + c] = byte r of t[perm[c]].
inline void transpose8x8_gathered(const uint64_t* t, const int32_t* perm, int8_t* const rows[8], int64_t j) {
  __m128i in[8], out[4];
  for (int c = 0; c < 8; ++c) in[c] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t + perm[c]));
  transpose8x8_regs(in, out);
  for (int i = 0; i < 4; ++i) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(rows[2 * i] + j), out[i]);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(rows[2 * i + 1] + j), _mm_unpackhi_epi64(out[i], out[i]));
  }
}
// Per-thread words for one run's channel-major codes.
inline uint64_t* perm_scratch(int64_t n) {
  thread_local std::vector<uint64_t> t;
  if (int64_t(t.size()) < n) t.resize(size_t(n));
  return t.data();
}
#endif

}  // namespace moe_cpu
