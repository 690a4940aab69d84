// The arithmetic of the AVX2 Q4_0 row tile (kernels/int_avx2_g32.h, qword panels, 8 rows x 8 columns, groups of
// 32) on its own, all data in L1, in cycles per row and group of 8 columns, calibrated against this core's
// vpmaddubsw peak (2 a cycle on Intel since Haswell and on Zen 3 / 4) measured around each run: a VM without a PMU
// whose clock moves. docs/performance.md compares it with llvm-mca's bound and the library's tile.
//
//   g++ -std=c++17 -O2 -mavx2 -mfma -mf16c -Icpp/src -Icpp/include bench/g32_tile_micro.cpp -o /tmp/g32_tile_micro
//   /tmp/g32_tile_micro
//
// Variants: 0 the tile as the library computes it (zero point, convert, block scale, FMA with the group scale);
// 1 without the fp32 epilogue (convert and add only); 2 as 0 with each row's activations, block scales and zero
// terms behind per-row pointers (the library's G32Rows); 3 codes unpacked once to L1, then rows outer and groups
// inner (one sum per half in registers, no spills).
#define MOE_ISA avx2  // kernels/isa.h
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/int_avx2_g32.h"

constexpr int G = 64, MR = 8;  // K = 2048 (Qwen3-30B-A3B's w13), one tile
alignas(64) uint8_t panel[G * 512];
alignas(64) int8_t act[MR][G * 32];
alignas(64) float bs[MR][G], sc[G][16];
alignas(32) int32_t zs[MR][G];
alignas(64) __m256i unpacked[2][G][8];
int8_t* row_act[MR];
float* row_bs[MR];

// The library's own dot of one row and group (kernels/int_avx2_g32.h).
static inline __m256i group_dot(const __m256i* lo, const __m256i* hi, const int8_t* y, __m256i ones) {
  return moe_cpu::kernels::avx2::qword_group(lo, hi, y, ones);
}

struct Rows {
  const int8_t* a[MR];
  const float* b[MR];
  alignas(32) int32_t z[MR][G];
};

template <int V>
__attribute__((noinline)) void tile(float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  Rows R;
  for (int r = 0; r < MR; ++r) {
    R.a[r] = row_act[r], R.b[r] = row_bs[r];
    for (int g = 0; g < G; ++g) R.z[r][g] = zs[r][g];
  }
  for (int h = 0; h < 2; ++h) {
    __m256 acc[MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
    for (int gi = 0; gi < G; ++gi) {
      const uint8_t* pg = panel + h * 32 + gi * 256;
      const __m256 sv = _mm256_load_ps(sc[gi] + h * 8);
      __m256i lo[4], hi[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + t * 64));
        lo[t] = _mm256_and_si256(v, low4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      }
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        __m256i exact = group_dot(lo, hi, (V == 2 ? R.a[r] : act[r]) + gi * 32, ones);
        if constexpr (V == 1) {
          acc[r] = _mm256_add_ps(acc[r], _mm256_cvtepi32_ps(exact));
          continue;
        }
        exact = _mm256_sub_epi32(exact, _mm256_set1_epi32(V == 2 ? R.z[r][gi] : zs[r][gi]));
        const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(exact), _mm256_broadcast_ss(V == 2 ? R.b[r] + gi : &bs[r][gi]));
        acc[r] = _mm256_fmadd_ps(x, sv, acc[r]);
      }
    }
    for (int r = 0; r < MR; ++r) _mm256_storeu_ps(out + r * 16 + h * 8, acc[r]);
  }
}

__attribute__((noinline)) void tile_rows_outer(float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h)
    for (int gi = 0; gi < G; ++gi)
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + h * 32 + gi * 256 + t * 64));
        unpacked[h][gi][t] = _mm256_and_si256(v, low4);
        unpacked[h][gi][4 + t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      }
  for (int r = 0; r < MR; ++r) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int gi = 0; gi < G; ++gi) {
      const __m256i z = _mm256_set1_epi32(zs[r][gi]);
      const __m256 b = _mm256_broadcast_ss(&bs[r][gi]);
      const __m256i e0 = _mm256_sub_epi32(group_dot(unpacked[0][gi], unpacked[0][gi] + 4, act[r] + gi * 32, ones), z);
      const __m256i e1 = _mm256_sub_epi32(group_dot(unpacked[1][gi], unpacked[1][gi] + 4, act[r] + gi * 32, ones), z);
      acc0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(e0), b), _mm256_load_ps(sc[gi]), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(e1), b), _mm256_load_ps(sc[gi] + 8), acc1);
    }
    _mm256_storeu_ps(out + r * 16, acc0), _mm256_storeu_ps(out + r * 16 + 8, acc1);
  }
}

// vpmaddubsw a second, 10 independent chains.
__attribute__((noinline)) double maddubs_per_s(long n) {
  const __m256i w = _mm256_set1_epi8(5);
  __m256i a0 = _mm256_set1_epi16(0), a1 = _mm256_set1_epi16(1), a2 = _mm256_set1_epi16(2), a3 = _mm256_set1_epi16(3),
          a4 = _mm256_set1_epi16(4), a5 = _mm256_set1_epi16(5), a6 = _mm256_set1_epi16(6), a7 = _mm256_set1_epi16(7),
          a8 = _mm256_set1_epi16(8), a9 = _mm256_set1_epi16(9);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    a0 = _mm256_maddubs_epi16(w, a0), a1 = _mm256_maddubs_epi16(w, a1), a2 = _mm256_maddubs_epi16(w, a2);
    a3 = _mm256_maddubs_epi16(w, a3), a4 = _mm256_maddubs_epi16(w, a4), a5 = _mm256_maddubs_epi16(w, a5);
    a6 = _mm256_maddubs_epi16(w, a6), a7 = _mm256_maddubs_epi16(w, a7), a8 = _mm256_maddubs_epi16(w, a8);
    a9 = _mm256_maddubs_epi16(w, a9);
    asm volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile int keep = _mm256_extract_epi32(_mm256_add_epi16(a0, a9), 0);
  (void)keep;
  return n * 10 / s;
}

template <int V>
double seconds_per_tile(int reps) {
  alignas(32) float out[MR * 16];
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    if constexpr (V == 3) tile_rows_outer(out);
    else tile<V>(out);
    asm volatile("" ::"r"(out) : "memory");
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

int main() {
  for (int i = 0; i < G * 512; ++i) panel[i] = uint8_t(rand());
  for (int r = 0; r < MR; ++r) {
    row_act[r] = static_cast<int8_t*>(aligned_alloc(64, G * 32));
    row_bs[r] = static_cast<float*>(aligned_alloc(64, G * 4));
    for (int i = 0; i < G * 32; ++i) act[r][i] = int8_t(rand() % 255 - 127);
    for (int g = 0; g < G; ++g) bs[r][g] = 1e-3f, zs[r][g] = 8 * r;
    std::memcpy(row_act[r], act[r], G * 32), std::memcpy(row_bs[r], bs[r], G * 4);
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < 16; ++c) sc[g][c] = 1e-2f;
  const int reps = 20000;
  const double row_groups = 2.0 * G * MR;
  std::printf("cycles per row and group of 8 columns (2 vpmaddubsw a cycle = the measured peak)\n");
  for (int round = 0; round < 12; ++round) {
    const double p0 = maddubs_per_s(20000000);
    double t[4];
    for (int i = 0; i < 4; ++i) {  // a different variant first each round
      const int v = (round + i) % 4;
      t[v] = v == 0 ? seconds_per_tile<0>(reps) : v == 1 ? seconds_per_tile<1>(reps)
           : v == 2 ? seconds_per_tile<2>(reps) : seconds_per_tile<3>(reps);
    }
    const double hz = (p0 + maddubs_per_s(20000000)) / 4;  // cycles a second: half the maddubs rate
    std::printf("round %d: tile %.2f  no epilogue %.2f  per-row pointers %.2f  codes from L1, rows outer %.2f"
                "  (clock ~%.2f GHz)\n", round, t[0] * hz / row_groups, t[1] * hz / row_groups, t[2] * hz / row_groups,
                t[3] * hz / row_groups, hz * 1e-9);
  }
}
