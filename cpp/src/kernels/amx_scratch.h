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

namespace moe_cpu::kernels {

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

}  // namespace moe_cpu::kernels
