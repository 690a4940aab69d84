// float_amx.h — the shared kernel of bf16_amx and fp8w_amx (and their _amx_model test twins):
// tdpbf16ps on a tile backend T (amx_tiles.h).
// Tiles (amx_scratch.h): 32 rows x 32 columns of fp32 sums in C 0-3; A 4-5: 16 rows x 32 bf16
// activations (TileRows: in place or gathered); B 6-7: 16 rows of 16 columns x 2 bf16, which is a bf16 panel's
// rows as stored (read in place); fp8 e4m3 codes are decoded to bf16 (exact) into a scratch once
// per column pair and call. fp8: each K-block's fp32 sum times the column's block scale, fused into
// the running sum. The tile sums pairs in the hardware's order, so the bits may differ from the
// avx512bf16 kernels' within the fp32 tolerance (the int kernels do match theirs bitwise).
// Needs the backend's features only. Limits: fp8 block_k a multiple of 32 (or one K-block).
#pragma once
#include <cmath>

#include "common/layout.h"
#include "kernels/amx_panels.h"
#include "kernels/amx_scratch.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

template <class T, bool kFp8>
void float_amx_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  const int64_t R = a.rows, G = kFp8 ? w.num_groups() : 1, gl = w.group_len(), Kp = a.Kp;
  if (R == 0 || b0 >= b1) return;
  constexpr int64_t kk = 32, brow = 16 * 64;  // k per tile step; bytes of one B tile
  const int64_t Kt = layout::round_up(Kp, kk), Rp = layout::round_up(R, 16), steps = Kt / kk;
  ScratchArena& ar = ScratchArena::get();
  ar.reset(ScratchArena::piece(Rp * Kt, 2) + 2 * ScratchArena::piece(Kt * 16, 2) + 2 * ScratchArena::piece(brow, 1) +
           2 * ScratchArena::piece(32 * 32, 4));
  uint16_t* A = ar.take<uint16_t>(Rp * Kt);
  uint16_t* Bw = kFp8 ? ar.take<uint16_t>(2 * Kt * 16) : nullptr;  // decoded fp8, [2][Kt / 2][32]
  uint8_t* tail = ar.take<uint8_t>(2 * brow);                      // bf16: the last partial k-step of each panel
  float* cf = ar.take<float>(32 * 32);
  float* acc = kFp8 ? ar.take<float>(32 * 32) : nullptr;  // fp8: the sum over K-blocks
  const TileRows rows(a.bf16, a.row_idx, R, Kp, Kt, 2, reinterpret_cast<uint8_t*>(A));
  T::configure(tile_config(64));
  for (int64_t b = b0; b < b1; b += 2) {
    const int64_t nj = std::min<int64_t>(2, b1 - b);
    if constexpr (kFp8 && T::kSimdPanels) amx::decode_fp8_avx512(w, e, b, nj, Kt, Bw);
    else if constexpr (kFp8) decode_fp8(w, e, b, nj, Kt, Bw);
    const PanelSteps panel(w, e, b, kFp8 ? 0 : nj, brow, tail);
    const auto bsrc = [&](int64_t j, int64_t s) -> const void* {
      if constexpr (kFp8) return Bw + j * Kt * 16 + s * (brow / 2);
      else return panel(j, s);
    };
    const ScaleIndex sx(w, e, b, G);
    const auto group = [&](int64_t gi, int64_t, int64_t rr) {  // fp8: scaled into acc (bf16: one group, cf is the sum)
      if constexpr (kFp8) {
        if (gi == 0) std::fill(acc, acc + 32 * 32, 0.f);
        for (int64_t j = 0; j < nj; ++j) {
          const float* sc = w.scales.as<float>() + sx(j, gi);
          for (int64_t r = 0; r < rr; ++r)
            for (int n = 0; n < 16; ++n) acc[r * 32 + 16 * j + n] = std::fma(cf[r * 32 + 16 * j + n], sc[n], acc[r * 32 + 16 * j + n]);
        }
      }
    };
    const float* sum = kFp8 ? acc : cf;
    const auto done = [&](int64_t r0, int64_t rr) {
      for (int64_t r = 0; r < rr; ++r)
        for (int64_t j = 0; j < nj; ++j) {
          const int vc = valid_cols(w, b + j);
          std::copy(sum + r * 32 + 16 * j, sum + r * 32 + 16 * j + vc, c + (r0 + r) * ldc + 16 * (b - b0 + j));
        }
    };
    row_blocks<T, true>(rows, R, G, gl, kk, kk * 2, steps, nj, bsrc, cf, group, done);
  }
  T::release();
}

MOE_ISA_END
