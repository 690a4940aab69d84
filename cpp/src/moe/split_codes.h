// split_codes.h — int8 weights held as 2-, 4-, 5- or 6-bit codes (PackedExperts::split_bits; GGUF Q2_K, Q3_K, Q5_K,
// Q6_K): q = w + split_zero in [0, 2^bits). qweight holds q's lb low bits: lb = 4, q & 15 in the int4 panel layout
// (common/layout.h: per 8-k step 64 bytes, byte 4c + i holding k0 + i low and k0 + 4 + i high), or lb = 2 (2-bit
// codes), a plane laid out as the high bits below with xb = 2. qhigh holds q >> 4, xb = bits - lb bits a code (none
// for 2 and 4), per (expert, column block) in vectors of 64 bytes, each covering spv = 4 / xb steps: its bytes are the
// steps' bytes (4c + i) and code j = 2 (t % spv) + (k0 + 4 + i) of byte 4c + i keeps its xb bits at [xb j, xb j + xb).
// A kernel then ORs (vector >> xb j << lb) & mask into the step's low bits (one shift and one AND per 32 codes).
#pragma once
#include <cstdint>

#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

inline int split_lb(int bits) { return bits == 2 ? 2 : 4; }
inline int split_xb(int bits) { return bits - split_lb(bits); }
inline int64_t split_spv(int bits) { return split_xb(bits) ? 4 / split_xb(bits) : 1; }  // steps per qhigh vector
// Bytes of one (expert, column block) panel's low bits and of its qhigh: padded_k / 8 steps.
inline int64_t split_low_bytes(int64_t Kp, int bits) { return Kp / 8 * 64 * split_lb(bits) / 4; }
inline int64_t split_high_bytes(int64_t Kp, int bits) { return split_xb(bits) ? Kp / 8 / split_spv(bits) * 64 : 0; }

// xb-bit field j (0..3) of the planes' byte at step t, byte 4c + i of its vector (spv = 4 / xb steps a vector).
inline int split_field(const uint8_t* plane, int xb, int64_t t, int64_t byte, int j) {
  const int64_t spv = 4 / xb;
  return (plane[(t / spv) * 64 + byte] >> (xb * (2 * (t % spv) + j))) & ((1 << xb) - 1);
}
// q of code hi (0: k0 + i, 1: k0 + 4 + i) at step t, byte 4c + i, of one panel's low bits and qhigh.
inline int split_code(const uint8_t* low, const uint8_t* high, int bits, int64_t t, int64_t byte, int hi) {
  const int lb = split_lb(bits), xb = split_xb(bits);
  const int l = lb == 4 ? (low[t * 64 + byte] >> (4 * hi)) & 15 : split_field(low, 2, t, byte, hi);
  return xb ? l | split_field(high, xb, t, byte, hi) << lb : l;
}

// q (in [0, 2^bits)) of weight (e, n, k) of split codes.
inline int split_q(const PackedExperts& p, int64_t e, int64_t n, int64_t k) {
  const int64_t b = n / 16, pi = e * p.num_blocks() + b;
  const uint8_t* hv = p.qhigh.data() + pi * split_high_bytes(p.padded_k(), p.split_bits);
  return split_code(p.panel(e, b), hv, p.split_bits, k / 8, 4 * (n % 16) + k % 4, k % 8 >= 4);
}

// Splits p's int8 panels (kernel forms, set_kernel): when p is int8 A8 with groups of 16 or 32 along all of K (at most
// 512 of them), 5-bit codes only in groups of 32, and every value of its columns within 2^2, 2^4, 2^5 or 2^6 of the
// least (a last block's padding columns, never read, take q = 0).
void derive_split_codes(PackedExperts& p);
// The int8 panels of split codes (w + 128 per byte), for files and for kernels without the form.
AlignedBuffer joined_codes(const PackedExperts& p);
// Back to int8 panels (a kernel without the form).
void join_split_codes(PackedExperts& p);

}  // namespace moe_cpu
