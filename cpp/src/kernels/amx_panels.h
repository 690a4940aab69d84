// amx_panels.h — B tiles from the panels whose rows are not tile rows as stored: int4 codes widened to one
// byte each (through code_table) and fp8 e4m3 codes decoded to bf16 (exact), per column pair and GEMM call.
// Portable versions (the tile model's kernels) and AVX-512 ones (amx_panels_avx512.cpp, for the amx
// kernels; the AmxPanels test compares them with these).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/numeric.h"
#include "moe_cpu/packed_experts.h"

namespace moe_cpu::kernels {

// int4 panel rows (8 k per 64-byte row) of blocks [b, b + nj) widened to the int8 tile layout (4 k per
// row; the low nibbles give row 2t, the high ones row 2t + 1), mapped through code_table; rows up to
// Kt / 4 zero-filled.
inline void widen_int4(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t Kt, uint8_t* dst) {
  const int64_t rows = w.padded_k() / 8;
  for (int64_t j = 0; j < nj; ++j) {
    const uint8_t* src = w.panel(e, b + j);
    uint8_t* d = dst + j * Kt * 16;
    for (int64_t t = 0; t < rows; ++t) {
      uint8_t* lo = d + 2 * t * 64;
      for (int i = 0; i < 64; ++i) lo[i] = src[t * 64 + i] & 15, lo[64 + i] = src[t * 64 + i] >> 4;
      if (w.code_shuffle)
        for (int i = 0; i < 128; ++i) lo[i] = w.code_table[lo[i]];
    }
    std::memset(d + rows * 128, 0, size_t(Kt * 16 - rows * 128));
  }
}

// bf16 bits of every e4m3fn code (NaN codes are rejected at pack time).
struct E4m3Bf16Table {
  uint16_t v[256];
  E4m3Bf16Table() {
    for (int i = 0; i < 256; ++i) v[i] = e4m3fn_is_nan(uint8_t(i)) ? 0 : float_to_bf16(e4m3fn_to_float(uint8_t(i)));
  }
};

// fp8 panel rows (16 columns x 2 codes per 32 bytes) of blocks [b, b + nj) decoded to bf16 panel rows
// (64 bytes); rows up to Kt / 2 zero-filled.
inline void decode_fp8(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t Kt, uint16_t* dst) {
  static const E4m3Bf16Table table;
  const int64_t n = w.padded_k() / 2 * 32;  // codes per panel
  for (int64_t j = 0; j < nj; ++j) {
    const uint8_t* src = w.panel(e, b + j);
    uint16_t* d = dst + j * Kt * 16;
    for (int64_t i = 0; i < n; ++i) d[i] = table.v[src[i]];
    std::fill(d + n, d + Kt * 16, uint16_t(0));
  }
}

}  // namespace moe_cpu::kernels

// The same with AVX512BW (int4) and AVX512_VBMI (fp8): 64 codes per few instructions (the amx region).
namespace moe_cpu::kernels::amx {
void widen_int4_avx512(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t Kt, uint8_t* dst);
void decode_fp8_avx512(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t Kt, uint16_t* dst);

}  // namespace moe_cpu::kernels::amx
