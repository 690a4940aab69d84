// split_codes.h — int8 weights held as 5- or 6-bit codes (PackedExperts::split_bits; GGUF Q5_K, Q6_K): q = w +
// split_zero in [0, 2^bits). qweight holds q & 15 in the int4 panel layout (common/layout.h: per 8-k step 64 bytes,
// byte 4c + i holding k0 + i low and k0 + 4 + i high). qhigh holds q >> 4, xb = bits - 4 bits a code, per
// (expert, column block) in vectors of 64 bytes, each covering spv = 4 / xb steps: its bytes are the steps' bytes
// (4c + i) and code j = 2 (t % spv) + (high nibble) of byte 4c + i keeps its xb bits at bits [xb j, xb j + xb).
// A kernel then ORs (vector >> xb j << 4) & mask into the step's nibbles (one shift and one AND per 32 codes).
#pragma once
#include <cstdint>

#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

inline int split_xb(int bits) { return bits - 4; }
inline int64_t split_spv(int bits) { return 4 / split_xb(bits); }  // steps per qhigh vector
// Bytes of one (expert, column block) panel's qhigh: padded_k / 8 steps, a 64-byte vector per spv steps.
inline int64_t split_high_bytes(int64_t Kp, int bits) { return Kp / 8 / split_spv(bits) * 64; }

// q (in [0, 2^bits)) of weight (e, n, k) of split codes.
inline int split_q(const PackedExperts& p, int64_t e, int64_t n, int64_t k) {
  const int64_t t = k / 8, i = k % 4, c = n % 16, b = n / 16;
  const bool hi = k % 8 >= 4;
  const uint8_t nib = p.panel(e, b)[t * 64 + 4 * c + i];
  const int64_t spv = split_spv(p.split_bits), xb = split_xb(p.split_bits);
  const uint8_t* hv = p.qhigh.data() + (e * p.num_blocks() + b) * split_high_bytes(p.padded_k(), p.split_bits);
  const int j = int(2 * (t % spv) + hi);
  const int h = (hv[(t / spv) * 64 + 4 * c + i] >> (xb * j)) & ((1 << xb) - 1);
  return (hi ? nib >> 4 : nib & 15) | h << 4;
}

// Splits p's int8 panels (kernel forms, set_kernel): when p is int8 A8 with groups of 16 or 32 along all of K (at most
// 512 of them), 5-bit codes only in groups of 32, and every value of its columns within 2^5 or 2^6 of the least (a last
// block's padding columns, never read, take q = 0).
void derive_split_codes(PackedExperts& p);
// The int8 panels of split codes (w + 128 per byte), for files and for kernels without the form.
AlignedBuffer joined_codes(const PackedExperts& p);
// Back to int8 panels (a kernel without the form).
void join_split_codes(PackedExperts& p);

}  // namespace moe_cpu
