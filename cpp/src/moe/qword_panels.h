// qword_panels.h — int4 panels for the AVX2 vpmaddubsw kernel's plain or signed-codebook codes in groups of 32 (GGUF
// Q4_0, Q4_K, IQ4_NL, IQ4_XS) or signed-codebook codes in groups of 16 (IQ2_XS, IQ2_S, ik's IQ2_K / IQ3_K;
// PackedExperts::qword_panels, KernelDesc::qword_panels). The same bytes per step as the int4 panel layout
// (common/layout.h: 64 bytes = 16 columns x 8 k), another order inside each 32-byte half (8 columns): byte
// 32h + 16L + 8q + i holds code (column 8h + 4L + q, k 8t + i) in its low nibble and (column 8h + 4L + 2 + q,
// k 8t + i) in its high one. A column's 8 codes of a step fill one 8-byte lane, so one 8-byte broadcast of the
// activations meets both nibble vectors (no vpshufd), and a vphaddw of the two int16 sums puts the 8 columns back
// in order (int_avx2_g32.h, Codes::kQword).
#pragma once
#include <cstdint>

#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

// The largest code_table byte: above 31, the AVX2 vpmaddubsw kernel takes a codebook as |codebook| with the sign on the
// activations (Codes::kSigned), else as table bytes (Codes::kTable).
inline int code_table_top(const PackedExperts& p) {
  int top = 0;
  for (uint8_t u : p.code_table) top = top < u ? u : top;
  return top;
}

// The byte within a step of column c (0..15 of the block) and k (0..7 of the step), and whether its code is in
// the high nibble.
inline int64_t qword_byte(int64_t c, int64_t i, bool* high) {
  const int64_t h = c / 8, cc = c % 8;
  *high = cc % 4 >= 2;
  return 32 * h + 16 * (cc / 4) + 8 * (cc % 2) + i;
}

// Reorders p's int4 panels (kernel forms, set_kernel) when p is int4 A8 without zero points, its codes plain or through
// a codebook the kernel takes as |codebook| (code_table bytes above 31), in groups of 32 along all of K (at most 512),
// or of 16 through such a codebook.
void derive_qword_panels(PackedExperts& p);
// The int4 panels in the standard layout, for files and for kernels without the form.
AlignedBuffer standard_panels(const PackedExperts& p);
// Back to the standard layout.
void join_qword_panels(PackedExperts& p);

}  // namespace moe_cpu
