// a16_inner_loop.cpp — issue 33's two designs for int4 weights with 16-bit activations, measured on the decode
// inner loop (one row, M = 1) against today's W4A8 loop, per tier (docs/performance.md, "A16 designs").
// Weights: int4 panels as common/layout.h stores them (64 bytes = 16 columns x 8 k; low nibbles k0..3, high
// k4..7, u = q + 8), 8 panels x K 2048 (128 KiB, L2-resident: the loop's own cost, not DRAM's); a scale per
// (column, group of 128). Per tier:
//   w4a8:        nibbles -> vpdpbusd (AVX-512 VNNI) / vpmaddubsw + vpmaddwd (AVX2) with int8 activations;
//   a16 bf16 (a): codes widened to words, vpermw through a code -> bf16 table (AVX-512), vdpbf16ps with bf16
//                activations; AVX2: codes -> fp32 (vpmovzxbd + vcvtdq2ps), vfmadd231ps with fp32 activations;
//   a16 int16 (b): codes widened to words, vpdpwssd (AVX-512 VNNI) / vpmaddwd + vpaddd (AVX2) with int16
//                activations (one scale per group of 128 here).
// Each result is checked per column against float64 on the unquantized activations. Then the peak of each
// design's product instruction (the bound of prefill, where a widened panel chunk is reused from L1). Standalone:
//   g++ -O2 bench/a16_inner_loop.cpp -o /tmp/a16_inner_loop && /tmp/a16_inner_loop
#include <immintrin.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kK = 2048, kRows = kK / 8, kPanels = 8, kGroup = 128, kG = kK / kGroup, kRowsPerGroup = kGroup / 8;

struct Data {
  alignas(64) uint8_t w[kPanels][kRows][64];
  float scale[kPanels][kG][16];
  float a[kK];                        // activations
  int8_t a8[kK];                      // int8, one scale (per token)
  float s8;
  uint16_t abf[kK];                   // bf16 bits
  float af[kK];                       // bf16 values as fp32 (the AVX2 float path)
  int16_t a16[kK];                    // int16, one scale per group
  float s16[kG];
  alignas(64) uint16_t bf16_of_code[32];  // vpermw table: code u -> bf16(u - 8)
};

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
float bf16_value(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// code of column c at k (0 <= k < 8) in a panel row
int code(const uint8_t* row, int c, int k) { return k < 4 ? row[4 * c + k] & 15 : row[4 * c + k - 4] >> 4; }

void init(Data& d) {
  std::mt19937 g(33);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& p : d.w)
    for (auto& r : p)
      for (auto& b : r) b = uint8_t(byte(g));
  for (auto& p : d.scale)
    for (auto& gr : p)
      for (auto& s : gr) s = 0.01f * (1 + std::fabs(n(g)));
  float amax = 0;
  for (float& x : d.a) x = n(g), amax = std::max(amax, std::fabs(x));
  d.s8 = amax / 127;
  for (int k = 0; k < kK; ++k) {
    d.a8[k] = int8_t(std::nearbyint(d.a[k] / d.s8));
    d.abf[k] = bf16_bits(d.a[k]);
    d.af[k] = bf16_value(d.abf[k]);
  }
  for (int gi = 0; gi < kG; ++gi) {
    float m = 0;
    for (int k = 0; k < kGroup; ++k) m = std::max(m, std::fabs(d.a[gi * kGroup + k]));
    d.s16[gi] = m / 32767;
    for (int k = 0; k < kGroup; ++k) d.a16[gi * kGroup + k] = int16_t(std::nearbyint(d.a[gi * kGroup + k] / d.s16[gi]));
  }
  for (int u = 0; u < 32; ++u) d.bf16_of_code[u] = bf16_bits(float((u & 15) - 8));
}

// out[p][c] in float64 from the unquantized activations
void reference(const Data& d, double out[kPanels][16]) {
  for (int p = 0; p < kPanels; ++p)
    for (int c = 0; c < 16; ++c) {
      double s = 0;
      for (int t = 0; t < kRows; ++t)
        for (int k = 0; k < 8; ++k) s += double(d.a[8 * t + k]) * (code(d.w[p][t], c, k) - 8) * d.scale[p][t / kRowsPerGroup][c];
      out[p][c] = s;
    }
}

// Group sums of the activations: the u = q + 8 offset (sum of a * u - 8 * sum of a) for every path.
struct GroupSums {
  int32_t a8[kG];
  int32_t a16[kG];
};
GroupSums group_sums(const Data& d) {
  GroupSums s{};
  for (int gi = 0; gi < kG; ++gi)
    for (int k = gi * kGroup; k < (gi + 1) * kGroup; ++k) s.a8[gi] += d.a8[k], s.a16[gi] += d.a16[k];
  return s;
}

// ---- AVX-512 -------------------------------------------------------------------------------------------------
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,fma")))

AVX512 void w4a8_avx512(const Data& d, const GroupSums& gs, float out[kPanels][16]) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int p = 0; p < kPanels; ++p) {
    __m512 acc = _mm512_setzero_ps();
    for (int gi = 0; gi < kG; ++gi) {
      __m512i ai = _mm512_set1_epi32(-8 * gs.a8[gi]);
      for (int t = gi * kRowsPerGroup; t < (gi + 1) * kRowsPerGroup; ++t) {
        const __m512i v = _mm512_load_si512(d.w[p][t]);
        int32_t lo, hi;
        std::memcpy(&lo, d.a8 + 8 * t, 4), std::memcpy(&hi, d.a8 + 8 * t + 4, 4);
        ai = _mm512_dpbusd_epi32(ai, _mm512_and_si512(v, low4), _mm512_set1_epi32(lo));
        ai = _mm512_dpbusd_epi32(ai, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), _mm512_set1_epi32(hi));
      }
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai), _mm512_mul_ps(_mm512_loadu_ps(d.scale[p][gi]), _mm512_set1_ps(d.s8)), acc);
    }
    _mm512_storeu_ps(out[p], acc);
  }
}

// Lanes 2c, 2c + 1 of a pair of 16-lane accumulators (columns 0-7, 8-15) -> column c.
AVX512 void store_pairs(__m512 lo8, __m512 hi8, float* out) {
  alignas(64) float t[32];
  _mm512_store_ps(t, lo8), _mm512_store_ps(t + 16, hi8);
  for (int c = 0; c < 16; ++c) out[c] = t[2 * c] + t[2 * c + 1];
}
// The per-column scales of a group in the pair layout: lanes 2c, 2c + 1 hold column c (cols 0-7 / 8-15).
AVX512 __m512 pair_scales(const float* s, int half) {
  const __m512i idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_loadu_ps(s + 8 * half)));
}

AVX512 void a16_bf16_avx512(const Data& d, const GroupSums& gs, float out[kPanels][16]) {
  const __m512i low4 = _mm512_set1_epi16(0x0f), table = _mm512_load_si512(d.bf16_of_code);
  for (int p = 0; p < kPanels; ++p) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int gi = 0; gi < kG; ++gi) {
      __m512 g0 = _mm512_setzero_ps(), g1 = g0;
      for (int t = gi * kRowsPerGroup; t < (gi + 1) * kRowsPerGroup; ++t) {
        // columns 0-7 (bytes 0-31) and 8-15 (bytes 32-63), each raw byte a word; low nibbles k0..3, high k4..7
        const __m512i w0 = _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(d.w[p][t])));
        const __m512i w1 = _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(d.w[p][t] + 32)));
        uint64_t lo, hi;
        std::memcpy(&lo, d.abf + 8 * t, 8), std::memcpy(&hi, d.abf + 8 * t + 4, 8);
        const __m512bh alo = (__m512bh)_mm512_set1_epi64(int64_t(lo)), ahi = (__m512bh)_mm512_set1_epi64(int64_t(hi));
        g0 = _mm512_dpbf16_ps(g0, (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(w0, low4), table), alo);
        g1 = _mm512_dpbf16_ps(g1, (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(w1, low4), table), alo);
        g0 = _mm512_dpbf16_ps(g0, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w0, 4), table), ahi);
        g1 = _mm512_dpbf16_ps(g1, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w1, 4), table), ahi);
      }
      acc0 = _mm512_fmadd_ps(g0, pair_scales(d.scale[p][gi], 0), acc0);
      acc1 = _mm512_fmadd_ps(g1, pair_scales(d.scale[p][gi], 1), acc1);
    }
    store_pairs(acc0, acc1, out[p]);
  }
  (void)gs;  // the table holds u - 8: no offset term
}

AVX512 void a16_int16_avx512(const Data& d, const GroupSums& gs, float out[kPanels][16]) {
  const __m512i low4 = _mm512_set1_epi16(0x0f);
  for (int p = 0; p < kPanels; ++p) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int gi = 0; gi < kG; ++gi) {
      // sum of a * u per lane; the -8 * sum(a) offset spread over the two lanes of a column (half each)
      __m512i i0 = _mm512_set1_epi32(-4 * gs.a16[gi]), i1 = i0;
      for (int t = gi * kRowsPerGroup; t < (gi + 1) * kRowsPerGroup; ++t) {
        const __m512i w0 = _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(d.w[p][t])));
        const __m512i w1 = _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(d.w[p][t] + 32)));
        uint64_t lo, hi;
        std::memcpy(&lo, d.a16 + 8 * t, 8), std::memcpy(&hi, d.a16 + 8 * t + 4, 8);
        const __m512i alo = _mm512_set1_epi64(int64_t(lo)), ahi = _mm512_set1_epi64(int64_t(hi));
        i0 = _mm512_dpwssd_epi32(i0, _mm512_and_si512(w0, low4), alo);
        i1 = _mm512_dpwssd_epi32(i1, _mm512_and_si512(w1, low4), alo);
        i0 = _mm512_dpwssd_epi32(i0, _mm512_srli_epi16(w0, 4), ahi);
        i1 = _mm512_dpwssd_epi32(i1, _mm512_srli_epi16(w1, 4), ahi);
      }
      const __m512 s = _mm512_set1_ps(d.s16[gi]);
      acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(pair_scales(d.scale[p][gi], 0), s), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(pair_scales(d.scale[p][gi], 1), s), acc1);
    }
    store_pairs(acc0, acc1, out[p]);
  }
}

// ---- AVX2 ----------------------------------------------------------------------------------------------------
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 void w4a8_avx2(const Data& d, const GroupSums& gs, float out[kPanels][16]) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int p = 0; p < kPanels; ++p) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int gi = 0; gi < kG; ++gi) {
      __m256i ai[2] = {_mm256_set1_epi32(-8 * gs.a8[gi]), _mm256_set1_epi32(-8 * gs.a8[gi])};
      for (int t = gi * kRowsPerGroup; t < (gi + 1) * kRowsPerGroup; ++t) {
        int32_t lo, hi;
        std::memcpy(&lo, d.a8 + 8 * t, 4), std::memcpy(&hi, d.a8 + 8 * t + 4, 4);
        const __m256i alo = _mm256_set1_epi32(lo), ahi = _mm256_set1_epi32(hi);
        for (int h = 0; h < 2; ++h) {  // columns 0-7, 8-15
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(d.w[p][t] + 32 * h));
          const __m256i l = _mm256_and_si256(v, low4), u = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          ai[h] = _mm256_add_epi32(ai[h], _mm256_madd_epi16(_mm256_maddubs_epi16(l, alo), ones));
          ai[h] = _mm256_add_epi32(ai[h], _mm256_madd_epi16(_mm256_maddubs_epi16(u, ahi), ones));
        }
      }
      for (int h = 0; h < 2; ++h)
        acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[h]),
                                 _mm256_mul_ps(_mm256_loadu_ps(d.scale[p][gi] + 8 * h), _mm256_set1_ps(d.s8)), acc[h]);
    }
    _mm256_storeu_ps(out[p], acc[0]), _mm256_storeu_ps(out[p] + 8, acc[1]);
  }
}

// (a) on AVX2: each code widened to fp32 (u - 8, exact), one FMA per weight with the fp32 (bf16-valued)
// activations; an accumulator per column pair, so each column's sum is recoverable.
AVX2 void a16_f32_avx2(const Data& d, const GroupSums& gs, float out[kPanels][16]) {
  const __m256i low4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
  for (int p = 0; p < kPanels; ++p) {
    __m256 acc[8] = {};
    for (int gi = 0; gi < kG; ++gi) {
      __m256 g[8];
      for (auto& x : g) x = _mm256_setzero_ps();
      for (int t = gi * kRowsPerGroup; t < (gi + 1) * kRowsPerGroup; ++t) {
        const __m256 alo = _mm256_permute2f128_ps(_mm256_castps128_ps256(_mm_loadu_ps(d.af + 8 * t)), _mm256_setzero_ps(), 0);
        const __m256 ahi = _mm256_permute2f128_ps(_mm256_castps128_ps256(_mm_loadu_ps(d.af + 8 * t + 4)), _mm256_setzero_ps(), 0);
        for (int q = 0; q < 8; ++q) {  // 8 bytes: columns 2q, 2q + 1 (lanes 0-3, 4-7), k0..3 low / k4..7 high
          const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(d.w[p][t] + 8 * q)));
          g[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, low4), eight)), alo, g[q]);
          g[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 4), eight)), ahi, g[q]);
        }
      }
      for (int q = 0; q < 8; ++q) {
        const __m256 s = _mm256_set_m128(_mm_set1_ps(d.scale[p][gi][2 * q + 1]), _mm_set1_ps(d.scale[p][gi][2 * q]));
        acc[q] = _mm256_fmadd_ps(g[q], s, acc[q]);
      }
    }
    for (int q = 0; q < 8; ++q) {
      alignas(32) float t8[8];
      _mm256_store_ps(t8, acc[q]);
      out[p][2 * q] = t8[0] + t8[1] + t8[2] + t8[3], out[p][2 * q + 1] = t8[4] + t8[5] + t8[6] + t8[7];
    }
  }
  (void)gs;
}

// (b) on AVX2: codes widened to words, vpmaddwd with int16 activation pairs, vpaddd.
AVX2 void a16_int16_avx2(const Data& d, const GroupSums& gs, float out[kPanels][16]) {
  const __m256i low4 = _mm256_set1_epi16(0x0f);
  for (int p = 0; p < kPanels; ++p) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int gi = 0; gi < kG; ++gi) {
      __m256i ai[4];
      for (auto& x : ai) x = _mm256_set1_epi32(-4 * gs.a16[gi]);
      for (int t = gi * kRowsPerGroup; t < (gi + 1) * kRowsPerGroup; ++t) {
        uint64_t lo, hi;
        std::memcpy(&lo, d.a16 + 8 * t, 8), std::memcpy(&hi, d.a16 + 8 * t + 4, 8);
        const __m256i alo = _mm256_set1_epi64x(int64_t(lo)), ahi = _mm256_set1_epi64x(int64_t(hi));
        for (int q = 0; q < 4; ++q) {  // 16 bytes: columns 4q..4q+3 -> lanes 2c, 2c + 1
          const __m256i w = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(d.w[p][t] + 16 * q)));
          ai[q] = _mm256_add_epi32(ai[q], _mm256_madd_epi16(_mm256_and_si256(w, low4), alo));
          ai[q] = _mm256_add_epi32(ai[q], _mm256_madd_epi16(_mm256_srli_epi16(w, 4), ahi));
        }
      }
      const __m256i idx = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
      for (int q = 0; q < 4; ++q) {
        const __m256 s = _mm256_mul_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(d.scale[p][gi] + 4 * q)), idx),
                                       _mm256_set1_ps(d.s16[gi]));
        acc[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[q]), s, acc[q]);
      }
    }
    for (int q = 0; q < 4; ++q) {
      alignas(32) float t8[8];
      _mm256_store_ps(t8, acc[q]);
      for (int c = 0; c < 4; ++c) out[p][4 * q + c] = t8[2 * c] + t8[2 * c + 1];
    }
  }
}

// ---- Peaks: the multiply-adds per second of each design's product instruction, 12 independent chains ------------
#define R12(I, S) I " %%" S "13, %%" S "14, %%" S "0\n" I " %%" S "13, %%" S "14, %%" S "1\n" I " %%" S "13, %%" S "14, %%" S "2\n" \
  I " %%" S "13, %%" S "14, %%" S "3\n" I " %%" S "13, %%" S "14, %%" S "4\n" I " %%" S "13, %%" S "14, %%" S "5\n"          \
  I " %%" S "13, %%" S "14, %%" S "6\n" I " %%" S "13, %%" S "14, %%" S "7\n" I " %%" S "13, %%" S "14, %%" S "8\n"          \
  I " %%" S "13, %%" S "14, %%" S "9\n" I " %%" S "13, %%" S "14, %%" S "10\n" I " %%" S "13, %%" S "14, %%" S "11\n"
// vpmaddwd + vpaddd: 12 chains, each product (alternately in ymm12 / ymm15) added to its accumulator
#define MADD12                                                                                                   \
  "vpmaddwd %%ymm13, %%ymm14, %%ymm12\n vpaddd %%ymm12, %%ymm0, %%ymm0\n vpmaddwd %%ymm13, %%ymm14, %%ymm15\n"      \
  "vpaddd %%ymm15, %%ymm1, %%ymm1\n vpmaddwd %%ymm13, %%ymm14, %%ymm12\n vpaddd %%ymm12, %%ymm2, %%ymm2\n"         \
  "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n vpaddd %%ymm15, %%ymm3, %%ymm3\n vpmaddwd %%ymm13, %%ymm14, %%ymm12\n"      \
  "vpaddd %%ymm12, %%ymm4, %%ymm4\n vpmaddwd %%ymm13, %%ymm14, %%ymm15\n vpaddd %%ymm15, %%ymm5, %%ymm5\n"         \
  "vpmaddwd %%ymm13, %%ymm14, %%ymm12\n vpaddd %%ymm12, %%ymm6, %%ymm6\n vpmaddwd %%ymm13, %%ymm14, %%ymm15\n"      \
  "vpaddd %%ymm15, %%ymm7, %%ymm7\n vpmaddwd %%ymm13, %%ymm14, %%ymm12\n vpaddd %%ymm12, %%ymm8, %%ymm8\n"         \
  "vpmaddwd %%ymm13, %%ymm14, %%ymm15\n vpaddd %%ymm15, %%ymm9, %%ymm9\n vpmaddwd %%ymm13, %%ymm14, %%ymm12\n"      \
  "vpaddd %%ymm12, %%ymm10, %%ymm10\n vpmaddwd %%ymm13, %%ymm14, %%ymm15\n vpaddd %%ymm15, %%ymm11, %%ymm11\n"
#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm15", "cc"
#define PEAK(name, body, tgt)                                                                         \
  __attribute__((target(tgt))) double name(long n) {                                                  \
    const auto t0 = std::chrono::steady_clock::now();                                                  \
    for (long i = 0; i < n; ++i) asm volatile(body : : : CLOBBER);                                     \
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(n);   \
  }
PEAK(peak_dpbusd, R12("vpdpbusd", "zmm"), "avx512f,avx512vnni")
PEAK(peak_dpwssd, R12("vpdpwssd", "zmm"), "avx512f,avx512vnni")
PEAK(peak_dpbf16, R12("vdpbf16ps", "zmm"), "avx512f,avx512bf16")
PEAK(peak_fma_ymm, R12("vfmadd231ps", "ymm"), "avx2,fma")
PEAK(peak_madd_ymm, MADD12, "avx2")

// GMAC/s of one core: best of 5 runs, `macs` multiply-adds per iteration
double gmacs(double (*f)(long), double macs) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) best = std::min(best, f(2000000));
  return macs / best * 1e-9;
}

using Fn = void (*)(const Data&, const GroupSums&, float[kPanels][16]);

double max_rel_err(float got[kPanels][16], double want[kPanels][16]) {
  double num = 0, den = 0;
  for (int p = 0; p < kPanels; ++p)
    for (int c = 0; c < 16; ++c) num = std::max(num, std::fabs(got[p][c] - want[p][c])), den = std::max(den, std::fabs(want[p][c]));
  return num / den;
}

// ns per 64-byte panel row (128 weights), best of 7 runs of n calls
double time_ns(Fn f, const Data& d, const GroupSums& gs, float out[kPanels][16]) {
  const int n = 2000;
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      f(d, gs, out);
      __asm__ volatile("" : : "r"(out) : "memory");
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / n / (kPanels * kRows) * 1e9;
}

}  // namespace

int main() {
  static Data d;
  init(d);
  const GroupSums gs = group_sums(d);
  static double want[kPanels][16];
  reference(d, want);
  static float out[kPanels][16];
  struct Row { const char* tier; const char* name; Fn f; bool ok; };
  const bool avx512 = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16") &&
                      __builtin_cpu_supports("avx512bw");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const Row rows[] = {
      {"avx512", "w4a8 (vpdpbusd)", w4a8_avx512, avx512},
      {"avx512", "a16 bf16 (a: vpermw + vdpbf16ps)", a16_bf16_avx512, avx512},
      {"avx512", "a16 int16 (b: vpdpwssd)", a16_int16_avx512, avx512},
      {"avx2", "w4a8 (vpmaddubsw + vpmaddwd)", w4a8_avx2, avx2},
      {"avx2", "a16 fp32 (a: cvt + vfmadd231ps)", a16_f32_avx2, avx2},
      {"avx2", "a16 int16 (b: vpmaddwd + vpaddd)", a16_int16_avx2, avx2},
  };
  std::printf("decode inner loop, one row, int4 panels L2-resident (%d KiB), K %d, groups of %d\n",
              kPanels * kRows * 64 / 1024, kK, kGroup);
  std::printf("%-7s %-36s %9s %12s %9s %10s\n", "tier", "loop", "ns/row", "GB/s int4", "vs w4a8", "max err");
  double base = 0;
  for (const Row& r : rows) {
    if (!r.ok) {
      std::printf("%-7s %-36s   (this CPU lacks the tier)\n", r.tier, r.name);
      continue;
    }
    const double ns = time_ns(r.f, d, gs, out);
    const double err = max_rel_err(out, want);
    if (std::strncmp(r.name, "w4a8", 4) == 0) base = ns;
    std::printf("%-7s %-36s %9.3f %12.2f %9.2f %10.1e\n", r.tier, r.name, ns, 64 / ns, ns / base, err);
  }
  // Prefill runs the product instruction on panels widened once into L1: its peak bounds each design.
  std::printf("\nproduct instruction peaks, one core (GMAC/s; 12 independent chains)\n");
  if (avx512)
    std::printf("avx512  vpdpbusd (w4a8) %.0f | vpdpwssd (b) %.0f | vdpbf16ps (a) %.0f\n", gmacs(peak_dpbusd, 12 * 64.),
                gmacs(peak_dpwssd, 12 * 32.), gmacs(peak_dpbf16, 12 * 32.));
  if (avx2)
    std::printf("avx2    vfmadd231ps (a) %.0f | vpmaddwd + vpaddd (b) %.0f\n", gmacs(peak_fma_ymm, 12 * 8.),
                gmacs(peak_madd_ymm, 12 * 16.));
}
