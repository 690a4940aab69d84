// amx_scratch.h — what the AMX kernels share beyond the tiles: a per-thread scratch arena, the
// activation rows gathered into the row-major block a tile loads, the tile-step shapes, and the
// per-expert choice between the tile kernel and its AVX-512 twin by rows.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/tile_driver.h"
#include "moe_cpu/cpu_features.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// Tile numbers: C(ra, j) = 2 ra + j (two 16-row tiles x two 16-column panels), A 4-5, B 6-7.
constexpr int kTileA = 4, kTileB = 6;

// Palette 1: C tiles 16 x 64 bytes, A tiles 16 rows x ka bytes, B tiles ka / 4 rows x 64 bytes.
inline TileConfig tile_config(int ka) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = kTileA; t < kTileA + 2; ++t) c.rows[t] = 16, c.colsb[t] = uint16_t(ka);
  for (int t = kTileB; t < kTileB + 2; ++t) c.rows[t] = uint8_t(ka / 4), c.colsb[t] = 64;
  return c;
}

// The B tiles of blocks [b, b + nj) read in place from panels whose rows are the tile rows (int8, bf16):
// k-step s at panel + s * brow while the whole tile lies in the panel, the partial last step from a
// zero-padded copy in tail [2][brow].
struct PanelSteps {
  const PackedExperts& w;
  int64_t e, b, brow, full;
  const uint8_t* tail;
  PanelSteps(const PackedExperts& w_, int64_t e_, int64_t b_, int64_t nj, int64_t brow_, uint8_t* tail_)
      : w(w_), e(e_), b(b_), brow(brow_), full(w_.panel_bytes() / brow_), tail(tail_) {
    const int64_t rest = w.panel_bytes() - full * brow;
    for (int64_t j = 0; j < nj && rest; ++j) {
      std::memcpy(tail_ + j * brow, w.panel(e, b + j) + full * brow, size_t(rest));
      std::memset(tail_ + j * brow + rest, 0, size_t(brow - rest));
    }
  }
  const uint8_t* operator()(int64_t j, int64_t s) const { return s < full ? w.panel(e, b + j) + s * brow : tail + j * brow; }
};

// C(ra, j) = A(4 + ra) x B(6 + j): tdpbf16ps (kBf16) or tdpbsud.
template <class T, bool kBf16, int c, int a, int b>
inline void tile_dot() {
  if constexpr (kBf16) T::template dpbf16ps<c, a, b>();
  else T::template dpbsud<c, a, b>();
}

// C tiles := the sum over k-steps [s0, s1) of the A tiles of the row block at a0 (row stride lda bytes, sa
// bytes per k-step; rows 16-31 only with `two`) times the B tiles bsrc(j, s) of panels j < nj; then stored
// to c [32][32] 4-byte sums (row stride 128 bytes).
template <class T, bool kBf16, class BSrc>
inline void tile_steps(const uint8_t* a0, int64_t lda, int64_t sa, int64_t s0, int64_t s1, bool two, int64_t nj,
                       const BSrc& bsrc, void* c) {
  T::template zero<0>(), T::template zero<1>(), T::template zero<2>(), T::template zero<3>();
  for (int64_t s = s0; s < s1; ++s) {
    T::template load<kTileA>(a0 + s * sa, lda);
    T::template load<kTileB>(bsrc(0, s), 64);
    tile_dot<T, kBf16, 0, kTileA, kTileB>();
    if (nj == 2) T::template load<kTileB + 1>(bsrc(1, s), 64), tile_dot<T, kBf16, 1, kTileA, kTileB + 1>();
    if (two) {
      T::template load<kTileA + 1>(a0 + 16 * lda + s * sa, lda);
      tile_dot<T, kBf16, 2, kTileA + 1, kTileB>();
      if (nj == 2) tile_dot<T, kBf16, 3, kTileA + 1, kTileB + 1>();
    }
  }
  uint8_t* cb = static_cast<uint8_t*>(c);
  T::template store<0>(cb, 128), T::template store<1>(cb + 64, 128);
  if (two) T::template store<2>(cb + 16 * 128, 128), T::template store<3>(cb + 16 * 128 + 64, 128);
}

// Per-thread bump allocator over one buffer kept between calls (64-byte aligned pieces).
class ScratchArena {
 public:
  static ScratchArena& get() {
    thread_local ScratchArena a;
    return a;
  }
  // Sizes the arena for `bytes` in all (rounded per piece) and starts handing out pieces.
  void reset(size_t bytes) {
    if (buf_.size() < bytes + 64) buf_.resize(bytes + 64);
    base_ = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf_.data()) + 63) & ~uintptr_t(63));
    used_ = 0;
  }
  template <class T> T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += (size_t(n) * sizeof(T) + 63) & ~size_t(63);
    return p;
  }
  static size_t piece(int64_t n, size_t size) { return (size_t(n) * size + 63) & ~size_t(63); }

 private:
  std::vector<uint8_t> buf_;
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
};

// Rows [0, R) of the activations (element size `es`, row stride Kp elements in the buffer, read through
// row_idx) copied to dst [round_up(R, 16)][Kt] with zeros past Kp and in the padding rows: the
// row-major block a tile load needs (the kernels' rows are scattered tokens).
inline void gather_rows(const void* src, const int32_t* row_idx, int64_t R, int64_t Kp, int64_t Kt, size_t es, void* dst) {
  const int64_t Rp = (R + 15) / 16 * 16;
  uint8_t* d = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(d + r * Kt * es, static_cast<const uint8_t*>(src) + row_idx[r] * Kp * es, size_t(Kp) * es);
    std::memset(d + (r * Kt + Kp) * es, 0, size_t(Kt - Kp) * es);
  }
  std::memset(d + R * Kt * es, 0, size_t((Rp - R) * Kt) * es);
}

// The activation rows a call's A tiles read (32-row blocks of two 16-row tiles). In place when the rows
// are consecutive buffer rows that need no K padding (GEMM2's rows, per expert), else gathered into
// `buf` [round_up(R, 16)][Kt]; a last 16-row tile that R does not fill is always read from a zero-padded
// copy, since a tile load reads all 16 rows.
struct TileRows {
  const uint8_t *base = nullptr, *tail = nullptr;
  int64_t stride = 0, tail_stride = 0, tail_r0 = 0;  // bytes per row; the block from which `tail` holds the rows
  TileRows(const void* src, const int32_t* row_idx, int64_t R, int64_t Kp, int64_t Kt, size_t es, uint8_t* buf) {
    bool consecutive = Kt == Kp;
    for (int64_t r = 1; r < R && consecutive; ++r) consecutive = row_idx[r] == row_idx[0] + r;
    tail_r0 = R % 16 ? (R - 1) / 32 * 32 : R;
    tail_stride = Kt * int64_t(es);
    if (!consecutive) {
      gather_rows(src, row_idx, R, Kp, Kt, es, buf);
      base = buf, stride = tail_stride, tail = buf + tail_r0 * tail_stride;
      return;
    }
    base = static_cast<const uint8_t*>(src) + row_idx[0] * Kp * int64_t(es), stride = Kp * int64_t(es);
    if (tail_r0 < R) gather_rows(src, row_idx + tail_r0, R - tail_r0, Kp, Kt, es, buf), tail = buf;
  }
  // First row of the block at r0 and its row stride in bytes.
  const uint8_t* block(int64_t r0, int64_t& st) const {
    if (r0 >= tail_r0) return st = tail_stride, tail + (r0 - tail_r0) * tail_stride;
    return st = stride, base + r0 * stride;
  }
};

// The rows of one column pair in 32-row blocks: for each block (rows [r0, r0 + rr)) and scale group gi
// (k-steps of kg elements, sa bytes each; the last group runs to `steps`), the group's C tiles go to c
// and group(gi, r0, rr) folds them into the block's sums; then done(r0, rr).
template <class T, bool kBf16, class BSrc, class Group, class Done>
void row_blocks(const TileRows& rows, int64_t R, int64_t G, int64_t gl, int64_t kg, int64_t sa, int64_t steps,
                int64_t nj, const BSrc& bsrc, void* c, Group&& group, Done&& done) {
  for (int64_t r0 = 0; r0 < R; r0 += 32) {
    const int64_t rr = std::min<int64_t>(32, R - r0);
    int64_t lda;
    const uint8_t* a0 = rows.block(r0, lda);
    for (int64_t gi = 0; gi < G; ++gi) {
      const int64_t s0 = gi * gl / kg, s1 = gi == G - 1 ? steps : (gi + 1) * gl / kg;
      tile_steps<T, kBf16>(a0, lda, sa, s0, s1, rr > 16, nj, bsrc, c);
      group(gi, r0, rr);
    }
    done(r0, rr);
  }
}

// Forms whose tiles lost to the AVX-512 twin on Emerald Rapids at 2 and 16 threads (docs/performance.md,
// "Xeon with AMX: when the tiles win (2 and 16 cores)"):
// A16 (0.31-0.58x at 1-128 rows per expert) and int4 / int8 in groups of 32 or less, GGUF's forms (0.49-1.08x at
// 16-128 rows: each 32-deep step pays a per-group epilogue; codebooks and K-quant mins 2.2-4.8x slower at 32).
// They take tiles only at a set threshold of 1, every expert on the tiles (the tests' setting); other thresholds
// leave them.
inline bool tiles_lose(const PackedExperts& w) {
  return w.a16 || (is_int_scheme(w.scheme) && w.group_size > 0 && w.group_size <= 32);
}
// The per-expert choice of an AMX kernel: experts with fewer than amx_min_rows() rows (bf16 / fp8:
// amx_min_rows_float()), or of a form whose tiles lose, go to its AVX-512 twin (same packed layout), the rest
// to the tiles (which gather scattered rows: KernelDesc::gathers_rows).
inline bool amx_takes_tiles(const PackedExperts& w, int64_t rows) {
  if (tiles_lose(w)) return amx_min_rows_set() && amx_min_rows() == 1;
  const bool fp = w.scheme == Scheme::kBf16 || w.scheme == Scheme::kFp8W8A16;
  return rows >= (fp ? amx_min_rows_float() : amx_min_rows());
}
inline bool model_takes_tiles(const PackedExperts&, int64_t) { return true; }  // the _amx_model kernels have no twin
template <const KernelDesc* kTwin, void (*kTiles)(const PackedExperts&, int64_t, int64_t, int64_t, const ActRows&, float*, int64_t)>
void amx_or_twin(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if (!amx_takes_tiles(w, a.rows)) return kTwin->gemm(w, e, b0, b1, a, c, ldc);
  kTiles(w, e, b0, b1, a, c, ldc);
}

MOE_ISA_END
