// float_avx2.h — the shared GEMM of bf16_avx2 and fp8w_avx2: weights widened to fp32, fp32 FMA
// against fp32 activations (the bf16-rounded values, ActRows::f32). Each output is one FMA chain
// over k in order (fp8: one chain per K-block, then accf = fma(sum, 256 * scale, accf)), so every
// row count gives the same bits:
//  - up to kDirectRows rows (decode): weights widened in registers, R rows x J blocks per tile;
//  - more rows: each column block's weights widened once per K chunk into a thread-local fp32
//    scratch [k][16] (16 KiB, L1) that 6x16 row tiles (12 ymm accumulators) read, so the widening
//    is paid once per panel, not once per row tile.
// bf16 panel row: 16 columns x (k, k+1) as 32-bit pairs: k is lane << 16, k+1 is lane & 0xffff0000.
// fp8 panel row: 16 columns x (k, k+1) codes. vpshufb puts each code in the high byte of a word;
// (word >>arith 1) & 0xbf80 is then the fp16 of code / 256 (normals and subnormals exactly) and
// vcvtph2ps widens it: 5 instructions per 16 codes, no table.
// Needs: AVX2, FMA, F16C. Limits: any M, N; fp8 block_k even (or one K-block).
#pragma once
#include <immintrin.h>

#include <cstdlib>
#include <new>

#include "common/layout.h"
#include "kernels/tile_driver.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// One k-step of a panel as fp32: w[0], w[1] = columns 0-7, 8-15 at k; w[2], w[3] the same at k+1.
// fp8 values are code / 256 (the 256 goes into the scale).
template <bool kFp8>
inline void widen_step(const uint8_t* panel, int64_t t, __m256 w[4]) {
  if constexpr (kFp8) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + t * 32));
    const __m256i even = _mm256_setr_epi8(-128, 0, -128, 2, -128, 4, -128, 6, -128, 8, -128, 10, -128, 12, -128, 14,
                                          -128, 0, -128, 2, -128, 4, -128, 6, -128, 8, -128, 10, -128, 12, -128, 14);
    const __m256i odd = _mm256_setr_epi8(-128, 1, -128, 3, -128, 5, -128, 7, -128, 9, -128, 11, -128, 13, -128, 15,
                                         -128, 1, -128, 3, -128, 5, -128, 7, -128, 9, -128, 11, -128, 13, -128, 15);
    const __m256i mask = _mm256_set1_epi16(short(0xbf80));
    const __m256i h0 = _mm256_and_si256(_mm256_srai_epi16(_mm256_shuffle_epi8(v, even), 1), mask);
    const __m256i h1 = _mm256_and_si256(_mm256_srai_epi16(_mm256_shuffle_epi8(v, odd), 1), mask);
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h0));
    w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h0, 1));
    w[2] = _mm256_cvtph_ps(_mm256_castsi256_si128(h1));
    w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(h1, 1));
  } else {
    const __m256i v0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + t * 64));
    const __m256i v1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + t * 64 + 32));
    const __m256i hi = _mm256_set1_epi32(int(0xffff0000u));
    w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    w[1] = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    w[2] = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
    w[3] = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
  }
}

// A 64-byte aligned thread-local float buffer of at least n floats (slot 0: weights, 1: state).
inline float* float_scratch(int slot, int64_t n) {
  struct Buf {
    float* p = nullptr;
    int64_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[2];
  Buf& b = bufs[slot];
  if (b.n < n) {
    std::free(b.p);
    b.p = static_cast<float*>(std::aligned_alloc(64, size_t((n * 4 + 63) / 64 * 64)));
    if (!b.p) throw std::bad_alloc();
    b.n = n;
  }
  return b.p;
}

template <bool kFp8>
struct FloatAvx2 {
  static constexpr int64_t kDirectRows = 4;    // more rows: widened scratch + 6-row tiles
  static constexpr int64_t kChunkSteps = 128;  // k-steps (2 k) per scratch chunk: 16 KiB of fp32
  static constexpr int64_t kStepBytes = kFp8 ? 32 : 64;  // panel bytes per k-step
  static constexpr int64_t kDecodePrefetchBytes = 2048;   // how far ahead decode prefetches each panel

  static __m256 scale256(const PackedExperts& w, const ScaleIndex& sx, int j, int64_t gi, int h) {
    return _mm256_mul_ps(_mm256_load_ps(w.scales.as<float>() + sx(j, gi) + 8 * h), _mm256_set1_ps(256.f));
  }

  // Rows [r0, r0+R) x blocks [b, b+J), weights widened in registers.
  template <int R, int J>
  static void direct(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
                     int64_t ldc) {
    const int64_t G = kFp8 ? w.num_groups() : 1, gl = w.group_len(), steps = a.Kp / 2;
    const uint8_t* panel[J];
    for (int j = 0; j < J; ++j) panel[j] = w.panel(e, b + j);
    const float* arow[R];
    for (int r = 0; r < R; ++r) arow[r] = a.f32 + a.row_idx[r0 + r] * a.Kp;
    const ScaleIndex sx(w, e, b);
    __m256 out[R][J][2];
    _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
      _Pragma("GCC unroll 16") for (int j = 0; j < J; ++j) out[r][j][0] = out[r][j][1] = _mm256_setzero_ps();
    for (int64_t gi = 0; gi < G; ++gi) {
      const int64_t s0 = gi * gl / 2, s1 = gi == G - 1 ? steps : (gi + 1) * gl / 2;
      __m256 acc[R][J][2];
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)
        _Pragma("GCC unroll 16") for (int j = 0; j < J; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
      for (int64_t t = s0; t < s1; ++t) {
        if constexpr (R == 1)  // decode streams weights from DRAM
          _Pragma("GCC unroll 16") for (int j = 0; j < J; ++j)
            _mm_prefetch(reinterpret_cast<const char*>(panel[j] + t * kStepBytes + kDecodePrefetchBytes), _MM_HINT_T1);
        _Pragma("GCC unroll 16") for (int j = 0; j < J; ++j) {
          __m256 wv[4];
          widen_step<kFp8>(panel[j], t, wv);
          _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {
            const __m256 a0 = _mm256_broadcast_ss(arow[r] + 2 * t), a1 = _mm256_broadcast_ss(arow[r] + 2 * t + 1);
            acc[r][j][0] = _mm256_fmadd_ps(wv[2], a1, _mm256_fmadd_ps(wv[0], a0, acc[r][j][0]));
            acc[r][j][1] = _mm256_fmadd_ps(wv[3], a1, _mm256_fmadd_ps(wv[1], a0, acc[r][j][1]));
          }
        }
      }
      _Pragma("GCC unroll 16") for (int j = 0; j < J; ++j)
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
          if constexpr (kFp8) {
            const __m256 s = scale256(w, sx, j, gi, h);
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) out[r][j][h] = _mm256_fmadd_ps(acc[r][j][h], s, out[r][j][h]);
          } else {
            _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) out[r][j][h] = acc[r][j][h];
          }
        }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) store_row(w, b + j, out[r][j], c + (r0 + r) * ldc + j * 16);
  }

  // The valid columns of one block's 16 values (two ymm) to dst.
  static void store_row(const PackedExperts& w, int64_t b, const __m256 v[2], float* dst) {
    const int valid = valid_cols(w, b);
    if (valid == 16) {
      _mm256_storeu_ps(dst, v[0]), _mm256_storeu_ps(dst + 8, v[1]);
      return;
    }
    alignas(32) float tmp[16];
    _mm256_store_ps(tmp, v[0]), _mm256_store_ps(tmp + 8, v[1]);
    for (int i = 0; i < valid; ++i) dst[i] = tmp[i];
  }

  // Rows [r0, r0+R) of one block over k-steps [t0, t1) from the widened scratch wk ([k - 2 t0][16]).
  // st[r][16] carries each row's running value between chunks: the chain sum when there is one
  // K-block (bf16, or fp8 with one block), else the scaled sum of the K-blocks done so far (chunks
  // are then whole K-blocks).
  template <int R>
  static void tile(const PackedExperts& w, const ScaleIndex& sx, const float* wk, const ActRows& a, int64_t r0,
                   int64_t t0, int64_t t1, bool first, bool last, float* st) {
    const int64_t G = kFp8 ? w.num_groups() : 1, gl = w.group_len(), steps = a.Kp / 2;
    const float* arow[R];
    for (int r = 0; r < R; ++r) arow[r] = a.f32 + a.row_idx[r0 + r] * a.Kp;
    __m256 v[R][2];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      v[r][0] = first ? _mm256_setzero_ps() : _mm256_load_ps(st + (r0 + r) * 16);
      v[r][1] = first ? _mm256_setzero_ps() : _mm256_load_ps(st + (r0 + r) * 16 + 8);
    }
    // K-blocks of this chunk (one pass over [t0, t1) when G == 1).
    for (int64_t gi = G == 1 ? 0 : 2 * t0 / gl; gi < G && (G == 1 ? gi < 1 : gi * gl / 2 < t1); ++gi) {
      const int64_t s0 = G == 1 ? t0 : gi * gl / 2, s1 = G == 1 ? t1 : (gi == G - 1 ? steps : (gi + 1) * gl / 2);
      __m256 acc[R][2];
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
        acc[r][0] = G == 1 ? v[r][0] : _mm256_setzero_ps();
        acc[r][1] = G == 1 ? v[r][1] : _mm256_setzero_ps();
      }
      const float* wp = wk + (s0 - t0) * 32;
      for (int64_t k = 2 * s0; k < 2 * s1; ++k, wp += 16) {
        const __m256 w0 = _mm256_load_ps(wp), w1 = _mm256_load_ps(wp + 8);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
          const __m256 x = _mm256_broadcast_ss(arow[r] + k);
          acc[r][0] = _mm256_fmadd_ps(w0, x, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(w1, x, acc[r][1]);
        }
      }
      if (G == 1) {
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) v[r][0] = acc[r][0], v[r][1] = acc[r][1];
      } else {
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
          const __m256 s = scale256(w, sx, 0, gi, h);
          _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) v[r][h] = _mm256_fmadd_ps(acc[r][h], s, v[r][h]);
        }
      }
    }
    if (kFp8 && G == 1 && last) {  // the one K-block's scale, as the direct path applies it
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
        const __m256 s = scale256(w, sx, 0, 0, h);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) v[r][h] = _mm256_fmadd_ps(v[r][h], s, _mm256_setzero_ps());
      }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      _mm256_store_ps(st + (r0 + r) * 16, v[r][0]);
      _mm256_store_ps(st + (r0 + r) * 16 + 8, v[r][1]);
    }
  }

  static void tiles_for(int64_t rem, const PackedExperts& w, const ScaleIndex& sx, const float* wk, const ActRows& a,
                        int64_t r0, int64_t t0, int64_t t1, bool first, bool last, float* st) {
    switch (rem) {
      case 1: return tile<1>(w, sx, wk, a, r0, t0, t1, first, last, st);
      case 2: return tile<2>(w, sx, wk, a, r0, t0, t1, first, last, st);
      case 3: return tile<3>(w, sx, wk, a, r0, t0, t1, first, last, st);
      case 4: return tile<4>(w, sx, wk, a, r0, t0, t1, first, last, st);
      case 5: return tile<5>(w, sx, wk, a, r0, t0, t1, first, last, st);
      default: return tile<6>(w, sx, wk, a, r0, t0, t1, first, last, st);
    }
  }

  // Blocks [b0, b1) of expert e for more than kDirectRows rows, through the widened scratch.
  static void tiled(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                    int64_t ldc) {
    const int64_t steps = a.Kp / 2, G = kFp8 ? w.num_groups() : 1, gl = w.group_len();
    // Chunks of whole K-blocks when there are several (their scaled sums carry over), else any length.
    const int64_t chunk = G == 1 ? kChunkSteps : gl / 2 * std::max<int64_t>(1, kChunkSteps / (gl / 2));
    float* wk = float_scratch(0, std::min(chunk, steps) * 32);
    float* st = float_scratch(1, a.rows * 16);
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* panel = w.panel(e, b);
      const ScaleIndex sx(w, e, b);
      for (int64_t t0 = 0; t0 < steps; t0 += chunk) {
        const int64_t t1 = std::min(steps, t0 + chunk);
        for (int64_t t = t0; t < t1; ++t) {
          __m256 wv[4];
          widen_step<kFp8>(panel, t, wv);
          float* dst = wk + (t - t0) * 32;
          _mm256_store_ps(dst, wv[0]), _mm256_store_ps(dst + 8, wv[1]);
          _mm256_store_ps(dst + 16, wv[2]), _mm256_store_ps(dst + 24, wv[3]);
        }
        // The next chunk (of this panel or the next block's) is prefetched a share per row tile.
        const char* next = reinterpret_cast<const char*>(panel + t1 * kStepBytes);
        const int64_t next_bytes = chunk * kStepBytes, ntiles = (a.rows + 5) / 6;
        for (int64_t r0 = 0, i = 0; r0 < a.rows; r0 += 6, ++i) {
          for (int64_t o = i * next_bytes / ntiles / 64 * 64; o < (i + 1) * next_bytes / ntiles; o += 64)
            _mm_prefetch(next + o, _MM_HINT_T0);
          tiles_for(a.rows - r0, w, sx, wk, a, r0, t0, t1, t0 == 0, t1 == steps, st);
        }
      }
      for (int64_t r = 0; r < a.rows; ++r) {
        const __m256 v[2] = {_mm256_load_ps(st + r * 16), _mm256_load_ps(st + r * 16 + 8)};
        store_row(w, b, v, c + r * ldc + (b - b0) * 16);
      }
    }
  }

  static void gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
                   int64_t ldc) {
    if (a.rows > kDirectRows) return tiled(w, e, b0, b1, a, c, ldc);
    int64_t b = b0;
    if (a.rows == 1) {  // 4 blocks: 8 independent FMA chains, 4 panel streams
      for (; b + 4 <= b1; b += 4) direct<1, 4>(w, e, b, a, 0, c + (b - b0) * 16, ldc);
      for (; b + 2 <= b1; b += 2) direct<1, 2>(w, e, b, a, 0, c + (b - b0) * 16, ldc);
    }
    for (; b < b1; ++b) {
      float* cb = c + (b - b0) * 16;
      switch (a.rows) {
        case 1: direct<1, 1>(w, e, b, a, 0, cb, ldc); break;
        case 2: direct<2, 1>(w, e, b, a, 0, cb, ldc); break;
        case 3: direct<3, 1>(w, e, b, a, 0, cb, ldc); break;
        case 4: direct<4, 1>(w, e, b, a, 0, cb, ldc); break;
        default: break;  // rows == 0
      }
    }
  }
};

MOE_ISA_END
