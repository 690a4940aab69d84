// layout.h — the blocked weight layout shared by every kernel (reference and SIMD).
// Columns (output features n) go in blocks of kNB = 16; K is padded to the scheme's k-step.
// Per (expert e, column block b) the weights are Kp/step rows of 64 bytes (32 for fp8):
//   int4 (step 8):  byte 4c+i holds column c's u(k0+i) in the low nibble and u(k0+4+i) in the high
//                   nibble, u in [0,15] (q+8 symmetric, raw with zero points): one AND / one shift
//                   give 16 columns x 4 k bytes for vpdpbusd / sdot.
//   int8 (step 4):  byte 4c+i = w(k0+i) + 128 (unsigned, zero point 128).
//   bf16 (step 2):  word 2c+i = w(k0+i) bits (vdpbf16ps pairs).
//   fp8  (step 2):  byte 2c+i = e4m3fn code of w(k0+i).
// Scales: float [E][NB][G][16] (fp8: the scale of each column's row block, G = K blocks).
// Zero points (int4 only): uint8 [E][NB][G][16]. Padding (k >= K, n >= N) holds zero codes; the
// activations are zero-padded too, so padding never contributes.
#pragma once
#include <cstdint>

#include "moe_cpu/types.h"

namespace moe_cpu::layout {

constexpr int64_t kNB = 16;

inline int64_t k_step(Scheme s) {
  switch (s) {
    case Scheme::kInt4W4A8: return 8;
    case Scheme::kInt8W8A8: return 4;
    default: return 2;
  }
}
inline int64_t step_bytes(Scheme s) { return s == Scheme::kFp8W8A16 ? 32 : 64; }
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t padded_k(Scheme s, int64_t K) { return round_up(K, k_step(s)); }
inline int64_t num_blocks(int64_t N) { return (N + kNB - 1) / kNB; }
// Bytes of one (expert, column block) panel.
inline int64_t panel_bytes(Scheme s, int64_t K) { return padded_k(s, K) / k_step(s) * step_bytes(s); }
// Zero point implied by the encoding when none is stored.
inline int implicit_zero(Scheme s) { return s == Scheme::kInt8W8A8 ? 128 : 8; }

}  // namespace moe_cpu::layout
