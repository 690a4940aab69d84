// act_buffer.h — the activation rows of one GEMM of the fused pass: int8 codes + row scale + per-group
// code sums (int schemes; A16: int16 codes, sums per group piece; A8 with activation blocks: a scale per block,
// the row scale 1, sums per piece), or bf16 bits / their fp32 values (float schemes), and the ActRows view a
// kernel reads.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/numeric.h"
#include "common/transpose8x8.h"
#include "dispatch/registry.h"
#include "moe/int_forms.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

// Activation rows prepared for one GEMM: int8 codes + row scale + per-group sums, or bf16 bits
// (or, for a kernel with f32_acts, their fp32 values); rows have stride Kp and zero padding.
struct ActBuffer {
  std::vector<int8_t> q;
  std::vector<int16_t> q16;  // A16 int schemes: int16 codes in a16_pos order (q unused)
  std::vector<float> s;
  std::vector<float> bs;  // A8 activation blocks: each piece's block scale, [rows, G * NP]
  std::vector<int32_t> asum;
  std::vector<float> asum_f32;  // for weights with float mins
  std::vector<int16_t> asum16;  // for weights with integer mins: [rows, G2] (G2: G padded to whole runs)
  std::vector<uint16_t> b;
  std::vector<float> f;
  int64_t K = 0, Kp = 0, gl = 0, G = 0;
  bool int_scheme = false, a16 = false, f32 = false, mins = false, imins = false;
  int64_t G2 = 0, NP = 1;  // NP: code sums per group (A16 pieces, or A8 activation blocks shorter than a group)
  int64_t B = 0, pk = 0;  // A8 activation block (0: per row); channels per piece when NP > 1

  // Sizes the buffers for `rows` rows (kept allocated across calls; set_row writes every byte).
  void reset(const PackedExperts& w, int64_t rows) {
    K = w.in_features, Kp = w.padded_k(), gl = w.group_len(), G = w.num_groups();
    int_scheme = is_int_scheme(w.scheme), a16 = int_scheme && w.a16;
    f32 = !int_scheme && w.kernel->f32_acts;
    // integer mins: int16 code sums per group where blocks are whole pairs of groups (others read asum_f32)
    imins = int_scheme && !a16 && w.has_mins && w.imin_groups > 0 && run_block_groups(w) != 0;
    B = int_scheme && !a16 ? w.act_block : 0;
    NP = int_scheme ? act_pieces(w) : 1;
    pk = a16 ? kA16Piece : B && B < gl ? B : 0;
    mins = int_scheme && w.has_mins;  // fp32 code sums: float mins, and the ymm kernels' integer mins
    G2 = imins ? imin_pairs(w) * 2 : 0;
    if (int_scheme) {
      (a16 ? q16.resize(static_cast<size_t>(rows * Kp)) : q.resize(static_cast<size_t>(rows * Kp)));
      s.resize(static_cast<size_t>(rows));
      asum.resize(static_cast<size_t>(rows * G * NP));
      if (B) bs.resize(static_cast<size_t>(rows * G * NP));
      if (mins) asum_f32.resize(static_cast<size_t>(rows * G));
      if (imins) asum16.resize(static_cast<size_t>(rows * G2));
    } else if (f32) {
      f.resize(static_cast<size_t>(rows * Kp));
    } else {
      b.resize(static_cast<size_t>(rows * Kp));
    }
  }
  // Fills buffer row `row` (and its zero padding) from fp32 values x[K]; `what` names them in errors.
  void set_row(int64_t row, const float* x, const char* what) {
    if (!int_scheme) return set_float_span(row, 0, x, K);
    if (a16) {
      const float amax = row_amax(x, K);
      if (amax < 0.f) throw ValueError(msg("non-finite ", what, " cannot be quantized to int16"));
      return set_int_row(row, x, amax);
    }
    int8_t* qr = q.data() + row * Kp;
    if (B ? !set_block_row(row, x) : !quantize_row_int8(x, K, qr, &s[size_t(row)]))
      throw ValueError(msg("non-finite ", what, " cannot be quantized to int8 (check the inputs and weights for overflow)"));
    if (!B) finish_int_row(row);
  }
  // A8 with activation blocks: each block of B channels of the row x[K] gets its own scale (amax / 127, 1 if all
  // zero) and codes, as a row would; the row scale is 1. False (the row unfinished) if x has a non-finite value.
  bool set_block_row(int64_t row, const float* x) {
    int8_t* qr = q.data() + row * Kp;
    float* br = bs.data() + row * G * NP;
    for (int64_t k0 = 0; k0 < K; k0 += B) {
      const float amax = row_amax(x + k0, B);
      if (amax < 0.f) return false;
      float sb;
      quantize_row_int8_amax(x + k0, B, amax, qr + k0, &sb);
      // the pieces this block covers: one per B channels when B < gl, else the groups inside it
      if (NP > 1) br[k0 / B] = sb;
      else for (int64_t gi = k0 / gl; gi < std::min(G, (k0 + B) / gl); ++gi) br[gi] = sb;
    }
    s[size_t(row)] = 1.f;
    finish_int_row(row);
    return true;
  }
  // Float schemes: values [k0, k0 + n) of row `row` rounded to bf16 (kept as bits, or as fp32 for
  // an f32_acts kernel); a span that ends at K also writes the zero padding.
  void set_float_span(int64_t row, int64_t k0, const float* x, int64_t n) {
    const int64_t end = k0 + n == K ? Kp : k0 + n;
    if (f32) {
      float* fr = f.data() + row * Kp;
      for (int64_t j = 0; j < n; ++j) fr[k0 + j] = bf16_to_float(float_to_bf16(x[j]));
      std::fill(fr + k0 + n, fr + end, 0.f);
    } else {
      uint16_t* br = b.data() + row * Kp;
      for (int64_t j = 0; j < n; ++j) br[k0 + j] = float_to_bf16(x[j]);
      std::fill(br + k0 + n, br + end, uint16_t(0));
    }
  }
  // Int schemes: row `row` from x[K] whose amax = max |x| is known and finite.
  void set_int_row(int64_t row, const float* x, float amax) {
    if (a16) {
      quantize_row_int16_amax(x, K, amax, q16.data() + row * Kp, &s[size_t(row)], a16_pos);
      return finish_a16_row(row);
    }
    if (B) {  // amax finite: so is every block
      set_block_row(row, x);
      return;
    }
    quantize_row_int8_amax(x, K, amax, q.data() + row * Kp, &s[size_t(row)]);
    finish_int_row(row);
  }
  // Int schemes (act-order): rows [row, row + R) are rows src_rows[0..R) of `src` (same weights)
  // with their channels gathered through one expert's perm[K] (each index loaded once for the R
  // rows); the per-token scale does not depend on the order, the group sums do.
  template <int R>
  void set_perm_rows(int64_t row, const ActBuffer& src, const int32_t* src_rows, const int32_t* perm) {
    if (a16) {  // int16 codes: one row at a time, positions through a16_pos on both sides
      for (int r = 0; r < R; ++r) {
        const int16_t* sr = src.q16.data() + src_rows[r] * src.Kp;
        int16_t* qr = q16.data() + (row + r) * Kp;
        s[size_t(row + r)] = src.s[size_t(src_rows[r])];
        for (int64_t j = 0; j < K; ++j) qr[a16_pos(j)] = sr[a16_pos(perm[j])];
        finish_a16_row(row + r);
      }
      return;
    }
    const int8_t* sr[R];
    int8_t* qr[R];
    for (int r = 0; r < R; ++r) {
      sr[r] = src.q.data() + src_rows[r] * src.Kp, qr[r] = q.data() + (row + r) * Kp;
      s[size_t(row + r)] = src.s[size_t(src_rows[r])];
    }
    const int64_t n = K;  // a local: int8 stores may alias the members
#if defined(__SSE2__)
    if constexpr (R == 8) {
      // Channel-major: t[k] holds channel k of the 8 rows, so each perm index moves one 8-byte word.
      uint64_t* t = perm_scratch(n);
      int64_t k = 0;
      for (; k + 8 <= n; k += 8) transpose8x8(sr, k, t + k);
      for (; k < n; ++k) {
        uint8_t b[8];
        for (int r = 0; r < 8; ++r) b[r] = uint8_t(sr[r][k]);
        std::memcpy(t + k, b, 8);
      }
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) transpose8x8_gathered(t, perm + j, qr, j);
      for (; j < n; ++j)
        for (int r = 0; r < 8; ++r) qr[r][j] = int8_t(t[perm[j]] >> (8 * r));
      for (int r = 0; r < R; ++r) finish_int_row(row + r);
      return;
    }
#endif
    int64_t j0 = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if constexpr (R == 1) {  // one row (decode): 8 bytes per store; perm is cold, read ahead of use
      for (; j0 + 8 <= n; j0 += 8) {
        __builtin_prefetch(perm + j0 + 256);
        uint64_t v = 0;
        for (int c = 0; c < 8; ++c) v |= uint64_t(uint8_t(sr[0][perm[j0 + c]])) << (8 * c);
        std::memcpy(qr[0] + j0, &v, 8);
      }
    }
#endif
    for (int64_t j = j0; j < n; ++j) {
      const int32_t k = perm[j];
      for (int r = 0; r < R; ++r) qr[r][j] = sr[r][k];
    }
    for (int r = 0; r < R; ++r) finish_int_row(row + r);
  }
  // Int schemes, once the codes [0, K) are set: zero padding and per-group code sums.
  void finish_int_row(int64_t row) {
    int8_t* qr = q.data() + row * Kp;
    for (int64_t k = K; k < Kp; ++k) qr[k] = 0;
    if (B) return finish_block_row(row);
    for (int64_t gi = 0; gi < G; ++gi) {
      int32_t sum = 0;
      for (int64_t k = gi * gl; k < std::min(K, (gi + 1) * gl); ++k) sum += qr[k];
      asum[size_t(row * G + gi)] = sum;
      if (mins) asum_f32[size_t(row * G + gi)] = float(sum);
      if (imins) asum16[size_t(row * G2 + gi)] = int16_t(sum);  // |sum| <= 127 gl <= 32767 (derive_int_mins)
    }
    if (imins) std::fill(asum16.begin() + row * G2 + G, asum16.begin() + (row + 1) * G2, int16_t(0));  // whole runs
  }
  // A8 with activation blocks: code sums per piece; for mins, per group the sum over its pieces of
  // float(code sum) * block scale, in piece order; integer mins (blocks of whole pairs of groups) the int16 sums.
  void finish_block_row(int64_t row) {
    const int8_t* qr = q.data() + row * Kp;
    const float* br = bs.data() + row * G * NP;
    const int64_t pl = NP > 1 ? pk : gl;
    for (int64_t gi = 0; gi < G; ++gi) {
      float fsum = 0.f;
      for (int64_t pi = 0; pi < NP; ++pi) {
        const int64_t k0 = gi * gl + pi * pl, k1 = std::min(K, k0 + pl);
        int32_t sum = 0;
        for (int64_t k = k0; k < k1; ++k) sum += qr[k];
        asum[size_t((row * G + gi) * NP + pi)] = sum;
        fsum += float(sum) * br[gi * NP + pi];
      }
      if (mins) asum_f32[size_t(row * G + gi)] = fsum;
      if (imins) asum16[size_t(row * G2 + gi)] = int16_t(asum[size_t(row * G + gi)]);  // NP = 1 (B >= gl)
    }
    if (imins) std::fill(asum16.begin() + row * G2 + G, asum16.begin() + (row + 1) * G2, int16_t(0));
  }
  // A16, once the codes [0, K) are set: zero padding, code sums per piece and (mins) per group.
  void finish_a16_row(int64_t row) {
    int16_t* qr = q16.data() + row * Kp;
    for (int64_t k = K; k < Kp; ++k) qr[a16_pos(k)] = 0;
    for (int64_t gi = 0; gi < G; ++gi) {
      int64_t gsum = 0;
      for (int64_t pi = 0; pi < NP; ++pi) {
        const int64_t k0 = gi * gl + pi * kA16Piece, k1 = std::min({K, (gi + 1) * gl, NP > 1 ? k0 + kA16Piece : K});
        int32_t sum = 0;  // |sum| <= 32767 * 256, or 32767 * gl for one piece (gl <= 256)
        for (int64_t k = k0; k < k1; ++k) sum += qr[a16_pos(k)];
        asum[size_t((row * G + gi) * NP + pi)] = sum;
        gsum += sum;
      }
      if (mins) asum_f32[size_t(row * G + gi)] = float(gsum);
    }
  }
  // Rows [0, R) are rows idx[0..R) of `src` (reset for the same weights), every per-row array copied.
  void copy_rows(const ActBuffer& src, const int32_t* idx, int64_t R) {
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = idx[r];
      if (int_scheme) {
        if (a16) std::memcpy(q16.data() + r * Kp, src.q16.data() + i * Kp, size_t(Kp) * sizeof(int16_t));
        else std::memcpy(q.data() + r * Kp, src.q.data() + i * Kp, size_t(Kp));
        s[size_t(r)] = src.s[size_t(i)];
        if (B) std::memcpy(bs.data() + r * G * NP, src.bs.data() + i * G * NP, size_t(G * NP) * sizeof(float));
        std::memcpy(asum.data() + r * G * NP, src.asum.data() + i * G * NP, size_t(G * NP) * sizeof(int32_t));
        if (mins) std::memcpy(asum_f32.data() + r * G, src.asum_f32.data() + i * G, size_t(G) * sizeof(float));
        if (imins) std::memcpy(asum16.data() + r * G2, src.asum16.data() + i * G2, size_t(G2) * sizeof(int16_t));
      } else if (f32) {
        std::memcpy(f.data() + r * Kp, src.f.data() + i * Kp, size_t(Kp) * sizeof(float));
      } else {
        std::memcpy(b.data() + r * Kp, src.b.data() + i * Kp, size_t(Kp) * sizeof(uint16_t));
      }
    }
  }
  ActRows view(const int32_t* row_idx, int64_t rows) const {
    ActRows a;
    a.rows = rows, a.Kp = Kp, a.row_idx = row_idx, a.G = G;
    if (int_scheme) {
      a.scale = s.data(), a.asum = asum.data(), a.asum_f32 = mins ? asum_f32.data() : nullptr, a.NP = NP, a.pk = pk;
      a.bscale = B ? bs.data() : nullptr;
      if (a16) a.q16 = q16.data();
      else a.q = q.data();
      if (imins) a.asum16 = asum16.data(), a.G2 = G2;
    } else if (f32) a.f32 = f.data();
    else a.bf16 = b.data();
    return a;
  }
};

}  // namespace moe_cpu
