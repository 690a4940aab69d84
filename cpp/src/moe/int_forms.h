// int_forms.h — the scales' blocked order ([E][NB][G][16], scale_index) and the integer forms of int scales
// and mins: every run of kIMinRun groups of a column factored exactly as d * integer (K-quants, IQ4_XS), for
// the kernels that read them (KernelDesc::int_mins / int_scales). Their layout, per column block (e, b):
//   iscales int8 [E][NB][runs * kIMinRun][16] and dscales fp16 [E][NB][runs][16];
//   imins int8 [E][NB][pairs = runs * kIMinRun / 2][16][2] and dmins fp16 [E][NB][runs][16] (kernels widen a pair of
//   int8 to the int16 pair that meets an int16 code-sum pair in vpmaddwd / vpdpwssd);
// runs = ceil(G / kIMinRun), the last run zero-padded. In 4 bits (PackedExperts::int_nibbles, GGUF Q2_K):
//   iscales and imins uint8 [E][NB][pairs][16], group 2p in the low nibble of byte (p, n), 2p + 1 in the high one;
//   dscales and dmins fp16 [E][NB][spans = ceil(runs / 2)][16], one per span of kNibbleSpan groups.
// The index arithmetic below is the one copy: the packers, scale() / min() and the kernels' IntFormBlock use it.
#pragma once
#include <algorithm>
#include <cstdint>

#include "common/parallel.h"
#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

// Runs of kIMinRun groups (whole, the last one padded) of a matrix with G groups.
inline int64_t int_form_runs(int64_t G) { return (G + kIMinRun - 1) / kIMinRun; }
// Integer mins met in fp32 (the imins against the groups' fp32 scaled code sums): A8 activation blocks shorter than a
// run of kIMinRun groups. A block of exactly one run scales the run's int32 sum instead.
inline bool imins_f32(const PackedExperts& p) { return p.act_block && p.act_block != kIMinRun * p.group_len(); }
// Groups of a run of kIMinRun that share one A8 activation block, where the int16 code sums serve: kIMinRun per
// token or where blocks cover whole runs, 2 or 4 where a block is that many groups (AVX2's run tiles sum each block
// in int32), else 0.
inline int64_t run_block_groups(const PackedExperts& p) {
  const int64_t gl = p.group_len();
  if (!p.act_block || p.act_block % (kIMinRun * gl) == 0) return kIMinRun;
  const int64_t nb = p.act_block / gl;
  return p.act_block % gl == 0 && (nb == 2 || nb == 4) ? nb : 0;
}
// Pairs of groups of the integer mins (0 without them): the int16 code-sum row length G2 = 2 * pairs.
inline int64_t imin_pairs(const PackedExperts& p) { return p.imin_groups ? int_form_runs(p.num_groups()) * (kIMinRun / 2) : 0; }
// First element of column block eb = e * NB + b in each buffer, with `runs` runs (pairs = runs * kIMinRun / 2).
inline int64_t iscale_block(int64_t eb, int64_t runs) { return eb * runs * kIMinRun * 16; }
inline int64_t int_d_block(int64_t eb, int64_t runs) { return eb * runs * 16; }  // dscales and dmins
inline int64_t imin_block(int64_t eb, int64_t pairs) { return eb * pairs * 32; }
// Index of (e, n, group gi) or (e, n, run) in each buffer.
inline int64_t iscale_index(const PackedExperts& p, int64_t e, int64_t n, int64_t gi) {
  return iscale_block(e * p.num_blocks() + n / 16, int_form_runs(p.num_groups())) + gi * 16 + n % 16;
}
inline int64_t int_d_index(const PackedExperts& p, int64_t e, int64_t n, int64_t run) {
  return int_d_block(e * p.num_blocks() + n / 16, int_form_runs(p.num_groups())) + run * 16 + n % 16;
}
inline int64_t imin_index(const PackedExperts& p, int64_t e, int64_t n, int64_t gi) {
  const int64_t pairs = int_form_runs(p.num_groups()) * (kIMinRun / 2);
  return imin_block(e * p.num_blocks() + n / 16, pairs) + ((gi / 2) * 16 + n % 16) * 2 + gi % 2;
}

// The 4-bit forms: groups per d (two runs), spans of a matrix with G groups, first element of column block eb, and
// the byte of (e, n, group gi) (its nibble: gi % 2) and the d of (e, n, span).
constexpr int64_t kNibbleSpan = 2 * kIMinRun;
inline int64_t int_nibble_spans(int64_t G) { return (int_form_runs(G) + 1) / 2; }
inline int64_t nibble_block(int64_t eb, int64_t pairs) { return eb * pairs * 16; }
inline int64_t nibble_d_block(int64_t eb, int64_t spans) { return eb * spans * 16; }
inline int64_t nibble_index(const PackedExperts& p, int64_t e, int64_t n, int64_t gi) {
  const int64_t pairs = int_form_runs(p.num_groups()) * (kIMinRun / 2);
  return nibble_block(e * p.num_blocks() + n / 16, pairs) + (gi / 2) * 16 + n % 16;
}
inline int64_t nibble_d_index(const PackedExperts& p, int64_t e, int64_t n, int64_t span) {
  return nibble_d_block(e * p.num_blocks() + n / 16, int_nibble_spans(p.num_groups())) + span * 16 + n % 16;
}

// A buffer of T in the scales' [E][NB][G][16] order; src(e, n, gi) gives each value. Written by the
// pool over (expert, column block) like the panels, so the pages are first-touched by the packing
// rank's threads (on its NUMA node) and not by the calling thread alone.
template <class T, class F>
AlignedBuffer blocked(const PackedExperts& p, F&& src) {
  const int64_t G = p.num_groups(), NB = p.num_blocks(), N = p.out_features;
  AlignedBuffer b(size_t(p.num_experts * NB * G * 16) * sizeof(T));
  T* d = b.as<T>();
  parallel_for(p.num_experts * NB, [&](int64_t eb) {
    const int64_t e = eb / NB, b16 = eb % NB;
    for (int64_t n = 16 * b16; n < std::min(N, 16 * b16 + 16); ++n)
      for (int64_t gi = 0; gi < G; ++gi) d[p.scale_index(e, n, gi)] = T(src(e, n, gi));
  });
  return b;
}

// The float mins in the scales' blocked order (from the integer form when the float ones were dropped).
AlignedBuffer float_mins(const PackedExperts& p);
// The float scales in their blocked order (from the integer or fp16 form when the float ones were dropped).
AlignedBuffer float_scales(const PackedExperts& p);
// Runs p with kernel kd from now on: scales and mins take the form kd reads (tests run every kernel), back to fp32
// where kd does not read a form p holds, then derived: integer mins, integer scales, else fp16 scales (each only
// where exact). The packers and load_packed call it with the kernel they choose.
void set_kernel(PackedExperts& p, const KernelDesc* kd);

}  // namespace moe_cpu
