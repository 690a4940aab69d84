// split_codes.h — int8 weights held as 2-, 3-, 4-, 5- or 6-bit codes (PackedExperts::split_bits; GGUF Q2_K, Q3_K,
// Q5_K, Q6_K): q = w + split_zero in [0, 2^bits), in planes of 64-byte vectors per (expert, column block), whose byte
// 4c + i holds bits of step t's two codes k0 + i (hi = 0) and k0 + 4 + i (hi = 1) of column c.
// - qweight, q's lb low bits: lb = 4 (4 to 6 bits), q & 15 in the int4 panel layout (common/layout.h: one vector a
//   step, nibble hi), or lb = 2 (2 and 3 bits), one vector per 2 steps, bits [2 (t % 2) + 4 hi, + 2).
// - qhigh, q >> lb, xb = bits - lb bits a code (none for 2 and 4), one vector per spv = 4 / xb steps (the last one
//   padded with zeros): 5 and 6 bits at [xb j, xb j + xb) for j = 2 (t % spv) + hi; 3 bits at ((t + 2) % 4) + 4 hi.
// So a kernel gets a step's codes with a shift and an AND of each plane and an OR (5, 6 bits: the high field shifted
// to bit 4), or for 3 bits one select of (low bits >> 2 (t % 2)) & 0x33 and the high bits shifted to bits 2 and 6,
// then & 7 and (>> 4) & 7: the lo and hi codes. A group shorter than a high vector (3 bits in groups of 16) starts at
// step 2 of its vector.
#pragma once
#include <cstdint>

#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

inline int split_lb(int bits) { return bits <= 3 ? 2 : 4; }
inline int split_xb(int bits) { return bits - split_lb(bits); }
inline int64_t split_spv(int bits) { return split_xb(bits) ? 4 / split_xb(bits) : 1; }  // steps per qhigh vector
// Bytes of one (expert, column block) panel's low bits and of its qhigh: padded_k / 8 steps.
inline int64_t split_low_bytes(int64_t Kp, int bits) { return Kp / 8 * 64 * split_lb(bits) / 4; }
inline int64_t split_high_bytes(int64_t Kp, int bits) {
  return split_xb(bits) ? (Kp / 8 + split_spv(bits) - 1) / split_spv(bits) * 64 : 0;
}

// Where code hi of step t keeps its low bits (qweight) and its high bits (qhigh): the byte offset of its vector
// (plus 4c + i) and the bit.
struct SplitPos {
  int64_t vec;
  int bit;
};
inline SplitPos split_low_pos(int bits, int64_t t, int hi) {
  return split_lb(bits) == 4 ? SplitPos{t * 64, 4 * hi} : SplitPos{t / 2 * 64, int(2 * (t % 2) + 4 * hi)};
}
inline SplitPos split_high_pos(int bits, int64_t t, int hi) {
  const int xb = split_xb(bits);
  const int64_t spv = 4 / xb;
  return bits == 3 ? SplitPos{t / 4 * 64, int((t + 2) % 4 + 4 * hi)} : SplitPos{t / spv * 64, int(xb * (2 * (t % spv) + hi))};
}
// q of code hi (0: k0 + i, 1: k0 + 4 + i) at step t, byte 4c + i, of one panel's low bits and qhigh.
inline int split_code(const uint8_t* low, const uint8_t* high, int bits, int64_t t, int64_t byte, int hi) {
  const int lb = split_lb(bits), xb = split_xb(bits);
  const SplitPos l = split_low_pos(bits, t, hi);
  const int q = (low[l.vec + byte] >> l.bit) & ((1 << lb) - 1);
  if (!xb) return q;
  const SplitPos h = split_high_pos(bits, t, hi);
  return q | ((high[h.vec + byte] >> h.bit) & ((1 << xb) - 1)) << lb;
}

// q (in [0, 2^bits)) of weight (e, n, k) of split codes.
inline int split_q(const PackedExperts& p, int64_t e, int64_t n, int64_t k) {
  const int64_t b = n / 16, pi = e * p.num_blocks() + b;
  const uint8_t* hv = p.qhigh.data() + pi * split_high_bytes(p.padded_k(), p.split_bits);
  return split_code(p.panel(e, b), hv, p.split_bits, k / 8, 4 * (n % 16) + k % 4, k % 8 >= 4);
}

// Splits p's int8 panels (kernel forms, set_kernel): when p is int8 A8 with groups of 16 or 32 along all of K (at most
// 512 of them), 5-bit codes only in groups of 32, and every value of its columns within 2^2, 2^3, 2^4, 2^5 or 2^6 of
// the least (a last block's padding columns, never read, take q = 0); 8 values take 3 bits where `three`, else 4.
void derive_split_codes(PackedExperts& p, bool three);
// The int8 panels of split codes (w + 128 per byte), for files and for kernels without the form.
AlignedBuffer joined_codes(const PackedExperts& p);
// Back to int8 panels (a kernel without the form).
void join_split_codes(PackedExperts& p);

}  // namespace moe_cpu
