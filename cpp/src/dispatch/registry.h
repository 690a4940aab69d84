// registry.h — kernel descriptors. A kernel file exports one constant KernelDesc; kernels.def
// lists them best first; the first one whose features are active is chosen at pack time.
#pragma once
#include <cstdint>
#include <vector>

#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

// A16 int schemes: a kernel's int32 sums of int16 codes times weight values run over pieces of at most
// kA16Piece channels of a group (|sum of code * (u - zero)| <= 256 * 32767 * 128 < 2^31, so wrapping int32
// sums are exact), each piece with its own code sum: ActRows::NP pieces per group.
constexpr int64_t kA16Piece = 256;
inline int64_t a16_pieces(int64_t group_len) { return group_len > kA16Piece ? ceil_div(group_len, kA16Piece) : 1; }
// Code sums per group of int weights' activation rows (ActRows::NP): A16 pieces, or the A8 activation blocks inside
// a group when they are shorter than it; else 1.
inline int64_t act_pieces(const PackedExperts& w) {
  const int64_t gl = w.group_len(), B = w.a16 ? 0 : w.act_block;
  return w.a16 ? a16_pieces(gl) : B && B < gl ? gl / B : 1;
}
// Where channel k sits in an int16 activation row: within each 4 channels the order is 0, 2, 1, 3, so that
// one 32-bit word holds the pair of codes that meets the even (or the odd) bytes of a 4-byte weight word.
inline int64_t a16_pos(int64_t k) { return (k & ~int64_t(3)) | ((k & 1) << 1) | ((k >> 1) & 1); }

// Activations of `rows` GEMM rows. Row r reads buffer row row_idx[r]; buffer rows have stride Kp
// (K padded to the weight layout's k-step, the padding zero-filled).
struct ActRows {
  int64_t rows = 0, Kp = 0;
  const int32_t* row_idx = nullptr;
  const int8_t* q = nullptr;       // int schemes: codes [*, Kp]
  const int16_t* q16 = nullptr;    //   or, A16 int schemes: int16 codes [*, Kp] in a16_pos order
  const float* scale = nullptr;    //   one scale per buffer row (1 with activation blocks: bscale holds them)
  const float* bscale = nullptr;   //   A8 activation blocks: the scale of each piece's block, [*, G * NP] (else nullptr)
  int64_t pk = 0;                  //   channels per piece when NP > 1 (A16: kA16Piece; A8: the activation block)
  const int32_t* asum = nullptr;   //   sum of the codes of each weight group: [*, G] (A16 and A8 blocks shorter than a
                                   //   group: of each piece, [*, G * NP])
  int64_t NP = 1;                  //   asum entries per group (pieces)
  const float* asum_f32 = nullptr; //   per group as fp32, for weights with mins (else nullptr); with bscale, the sum over
                                   //   the group's pieces of float(code sum) * block scale
  const int16_t* asum16 = nullptr; //   the same as int16 [*, G2] (G2 = 2 * imin_pairs(w), zero-padded), for integer mins
  int64_t G = 0, G2 = 0;
  const uint16_t* bf16 = nullptr;  // bf16 / fp8 schemes: bf16 bits [*, Kp]
  const float* f32 = nullptr;      //   or, for kernels with KernelDesc::f32_acts, those values as fp32
  // Set by a kernel for its own row tiles: one column block's fp32 scales and mins [G][16], built once
  // from the integer forms and shared by the block's row tiles (NEON: [block][G][16] from block wpanel_b; nullptr:
  // none).
  const float* blk_scales = nullptr;
  const float* blk_mins = nullptr;
  // Set by a kernel for its own row tiles: int8 panels of split codes' q bytes (PackedExperts::split_bits; zero point
  // split_zero; NEON: the bytes w + 128), block wpanel_b's first, Kp * 16 bytes each (nullptr: the weights' own panels).
  const uint8_t* wpanels = nullptr;
  int64_t wpanel_b = 0;
};

struct KernelDesc {
  const char* name;       // "<precision>_<isa>[_<MR>x<NR>]", also the test and bench name
  Scheme scheme;
  const char* isa;
  int mr, nr;             // register tile (1x1 for the reference)
  uint64_t features;      // CpuFeature bits it needs
  // Shape limits beyond the scheme's own (nullptr: none).
  bool (*supports)(const PackedExperts& w);
  // For column blocks [b0, b1) of expert e (16 columns each, the last one cut at N):
  // c[r * ldc + (n - 16 * b0)] = sum over k of a[r, k] * W[e][n, k] with the scheme's numerics.
  void (*gemm)(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c,
               int64_t ldc);
  bool f32_acts = false;  // bf16 / fp8: reads ActRows::f32 (broadcast fp32), not the bf16 bits
  bool int_mins = false;  // int schemes: takes PackedExperts' integer mins (and ActRows::asum16)
  bool int_scales = false;  // int schemes: takes PackedExperts' integer scales
  // Whether a call with this many rows copies the rows of a view whose row_idx are not consecutive (the
  // AMX kernels' A tiles; nullptr: never); the pipeline then gathers GEMM1's rows once per task.
  bool (*gathers_rows)(const PackedExperts& w, int64_t rows) = nullptr;
  bool half_scales = false;  // int schemes: takes fp16 scales (PackedExperts::half_scales)
  bool split_codes = false;  // int8: takes split 2- to 6-bit codes (PackedExperts::split_bits), and with them integer mins
  bool qword_panels = false;  // int4: takes qword panels (PackedExperts::qword_panels)
  bool split3 = false;        // split codes: takes 3-bit ones (without: codes of 8 values take 4 bits)
  bool int_nibbles = false;   // split codes: takes 2-bit ones' integer scales and mins in 4 bits (PackedExperts::int_nibbles)
};

// Best registered kernel for `w` (scheme and shape set) under the active features; the
// reference always qualifies.
const KernelDesc* select_kernel(const PackedExperts& w);
// Every registered kernel, best first.
const std::vector<const KernelDesc*>& all_kernels();

}  // namespace moe_cpu
