// tile_driver.h — walks a kernel's register tiles over (column blocks [b0, b1)) x (rows): column
// groups of NJ blocks outside, row tiles of MR inside, so the weight panels stay in L1/L2 across
// row tiles. With one row (decode) it takes ND blocks at a time; the x86 kernels take ND = 1: one sequential
// stream per thread (4-8 panels at once, streams 6-32 KiB apart, made decode 10-30% slower), but AVX-512 fp8's 2:
// one vdpbf16ps chain a panel held its decode below the memory's speed (docs/performance.md, "Decisions").
// Micro<R, J>::run(w, e, b, a, r0, c, ldc) computes rows [r0, r0+R) x blocks [b, b+J), writing c relative to
// block b.
#pragma once
#include <algorithm>
#include <cstdint>

#include "dispatch/registry.h"
#include "moe/int_forms.h"
#include "kernels/isa.h"

MOE_ISA_BEGIN

// The last `rem` rows (rem < R) of blocks [b, b+J) in one call of the matching tile height.
template <template <int, int> class Micro, int R, int J>
void tail_rows(int64_t rem, const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, int64_t r0, float* c,
               int64_t ldc) {
  if constexpr (R > 1) {
    if (rem == R - 1) return Micro<R - 1, J>::run(w, e, b, a, r0, c, ldc);
    tail_rows<Micro, R - 1, J>(rem, w, e, b, a, r0, c, ldc);
  }
}

// Rows [0, rows) of blocks [b, b+J): tiles of R rows, then one shorter tile for the rest.
template <template <int, int> class Micro, int R, int J>
void rows_of(const PackedExperts& w, int64_t e, int64_t b, const ActRows& a, float* c, int64_t ldc) {
  int64_t r = 0;
  for (; r + R <= a.rows; r += R) Micro<R, J>::run(w, e, b, a, r, c, ldc);
  if (r < a.rows) tail_rows<Micro, R, J>(a.rows - r, w, e, b, a, r, c, ldc);
}

template <template <int, int> class Micro, int MR, int NJ, int ND>
void drive(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  int64_t b = b0;
  if (a.rows == 1)  // decode: ND column panels per tile
    for (; b + ND <= b1; b += ND) Micro<1, ND>::run(w, e, b, a, 0, c + (b - b0) * 16, ldc);
  for (; b + NJ <= b1; b += NJ) rows_of<Micro, MR, NJ>(w, e, b, a, c + (b - b0) * 16, ldc);
  for (; b < b1; ++b) rows_of<Micro, MR, 1>(w, e, b, a, c + (b - b0) * 16, ldc);
}

// The A8 GEMMs of a kernel family Kern<kInt4, kTbl, kBlk> (the NEON dotprod and i8mm kernels): int4 codes through
// the codebook (kTbl) when it is not the default identity coding, activation blocks (kBlk) when the rows carry them.
template <template <bool, bool, bool> class Kern, int MR, int NJ, int ND, bool kBlk = false>
void int4_forms_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if (!kBlk && a.bscale) return int4_forms_gemm<Kern, MR, NJ, ND, true>(w, e, b0, b1, a, c, ldc);
  if (w.code_shuffle) drive<Kern<true, true, kBlk>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  else drive<Kern<true, false, kBlk>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}
template <template <bool, bool, bool> class Kern, int MR, int NJ, int ND>
void int8_forms_gemm(const PackedExperts& w, int64_t e, int64_t b0, int64_t b1, const ActRows& a, float* c, int64_t ldc) {
  if (a.bscale) drive<Kern<false, false, true>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
  else drive<Kern<false, false, false>::template Micro, MR, NJ, ND>(w, e, b0, b1, a, c, ldc);
}

// Software prefetch of the next column group's panels (blocks [b + nj, b + 2 nj)), spread over
// the row tiles that read the current group: the tile of rows [r0, r0 + R) of `rows` walks its
// share of the next group's bytes at up to N lines per k-step (N prefetches per step, no branch;
// a tile of R x NJ blocks needs R * NJ / rows lines per step),
// so DRAM streams the next group while the tiles compute on this one from L2 (groups larger than
// L2, e.g. K = 14336, are then read from L3 instead of DRAM). Off (a prefetch of the current
// panel) for decode and for groups over 4 MiB.
template <int N = 1>
struct NextGroupPrefetch {
  static constexpr int64_t kMaxGroupBytes = 4 << 20;
  const char* base;
  uint64_t pos = 0, rate = 0, last = 0;  // pos and rate in 1/65536 bytes
  NextGroupPrefetch(const PackedExperts& w, int64_t e, int64_t b, int64_t nj, int64_t r0, int64_t R, int64_t rows,
                    int64_t steps)
      : base(reinterpret_cast<const char*>(w.panel(e, b))) {
    const int64_t bytes = nj * w.panel_bytes();
    if (rows <= 1 || b + 2 * nj > w.num_blocks() || bytes > kMaxGroupBytes || steps <= 0) return;
    const int64_t o0 = r0 * bytes / rows, o1 = std::min(bytes, (r0 + R) * bytes / rows);
    base += bytes + o0;
    last = uint64_t(o1 - o0 - 1);
    rate = std::min<uint64_t>(uint64_t(64 * N) << 16, (uint64_t(o1 - o0) << 16) / uint64_t(steps));
  }
  // The same over split codes' high bits: `bytes` a column block from `cur`, when the next block exists (written out:
  // the constructor above delegating to this one made the AVX-512 int8 tiles 1.06-1.10x slower).
  NextGroupPrefetch(const uint8_t* cur, int64_t bytes, bool next, int64_t r0, int64_t R, int64_t rows, int64_t steps)
      : base(reinterpret_cast<const char*>(cur)) {
    if (rows <= 1 || !next || bytes <= 0 || bytes > kMaxGroupBytes || steps <= 0) return;
    const int64_t o0 = r0 * bytes / rows, o1 = std::min(bytes, (r0 + R) * bytes / rows);
    base += bytes + o0;
    last = uint64_t(o1 - o0 - 1);
    rate = std::min<uint64_t>(uint64_t(64 * N) << 16, (uint64_t(o1 - o0) << 16) / uint64_t(steps));
  }
  void step() {
    for (int i = 0; i < N; ++i) __builtin_prefetch(base + std::min((pos >> 16) + 64 * i, last), 0, 2);
    pos += rate;
  }
  // n steps at once: one line per 64 bytes of [pos, pos + n * rate) (for short scale groups, where
  // a call per step costs as much as the step).
  void steps(int64_t n) {
    const uint64_t end = pos + uint64_t(n) * rate;
    for (; pos < end; pos += uint64_t(64) << 16) __builtin_prefetch(base + std::min(pos >> 16, last), 0, 2);
    pos = end;
  }
};

// The k-steps [s0, s1) of one scale group, each through step(t), with the tile's next-group prefetch
// (kPrefetch: row tiles). With kUnroll (int8), groups of 4 and 8 steps (Q6_K's 16, Q5_K's 32) are unrolled
// with one prefetch call per group: a call per step costs as much as a quarter of a short step.
template <bool kUnroll, bool kPrefetch, class PF, class Step>
inline __attribute__((always_inline)) void group_steps(PF& pf, int64_t s0, int64_t s1, const Step& step) {
  if (kUnroll && s1 - s0 == 4) {
    if constexpr (kPrefetch) pf.steps(4);
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) step(s0 + q);
  } else if (kUnroll && s1 - s0 == 8) {
    if constexpr (kPrefetch) pf.steps(8);
    _Pragma("GCC unroll 8") for (int q = 0; q < 8; ++q) step(s0 + q);
  } else {
    for (int64_t t = s0; t < s1; ++t) {
      if constexpr (kPrefetch) pf.step();
      step(t);
    }
  }
}

// Index in the scales / zeros arrays of (block b + j, group gi, column 0) of expert e: the same as
// w.scale_index, without its division per call (kernels look it up per block and scale group).
struct ScaleIndex {
  int64_t base, G;
  ScaleIndex(const PackedExperts& w, int64_t e, int64_t b) : base(w.scale_index(e, 16 * b, 0)), G(w.num_groups()) {}
  // With G = w.num_groups() known (ActRows::G): no division per tile.
  ScaleIndex(const PackedExperts& w, int64_t e, int64_t b, int64_t G_) : base((e * w.num_blocks() + b) * G_ * 16), G(G_) {}
  int64_t operator()(int64_t j, int64_t gi) const { return base + (j * G + gi) * 16; }
};

// The integer K-quant forms of column block (e, b), where p holds them (else nullptr): int8 scales with
// an fp32 d per run, int8 min pairs with an fp32 dmin per run (layout: moe/int_forms.h); fp16 scales (hsc,
// indexed as the fp32 ones: ScaleIndex). Panel j is block b + j; with G known (ActRows::G), no division per tile.
struct IntFormBlock {
  const uint16_t* hsc = nullptr;
  const int8_t* isc = nullptr;
  const uint16_t* dsc = nullptr;  // fp16 d per run
  const int8_t* imn = nullptr;
  const uint16_t* dmn = nullptr;  // fp16 dmin per run
  int64_t runs, P2;  // runs of kIMinRun groups; pairs of groups (whole runs)
  // The 4-bit forms (PackedExperts::int_nibbles): isc / imn then point at nibble pairs and dsc / dmn at one d per span
  // (read only through the nib_* accessors below, by the kernels that take them).
  bool nib;
  int64_t spans;
  IntFormBlock(const PackedExperts& w, int64_t e, int64_t b, int64_t G)
      : runs(int_form_runs(G)), P2(runs * (kIMinRun / 2)), nib(w.int_nibbles), spans(int_nibble_spans(G)) {
    const int64_t eb = e * w.num_blocks() + b;
    if (w.half_scales) hsc = w.scales.as<uint16_t>();
    if (nib) {
      isc = w.iscales.as<int8_t>() + nibble_block(eb, P2), dsc = w.dscales.as<uint16_t>() + nibble_d_block(eb, spans);
      imn = w.imins.as<int8_t>() + nibble_block(eb, P2), dmn = w.dmins.as<uint16_t>() + nibble_d_block(eb, spans);
      return;
    }
    if (w.iscale_groups) isc = w.iscales.as<int8_t>() + iscale_block(eb, runs), dsc = w.dscales.as<uint16_t>() + int_d_block(eb, runs);
    if (w.imin_groups) imn = w.imins.as<int8_t>() + imin_block(eb, P2), dmn = w.dmins.as<uint16_t>() + int_d_block(eb, runs);
  }
  // 4-bit forms: the 16 bytes of panel j's scales / mins of the pair of groups (gi even, gi + 1), and the d / dmin of
  // group gi's span.
  const uint8_t* nib_sc(int64_t j, int64_t gi) const { return reinterpret_cast<const uint8_t*>(isc) + (j * P2 + gi / 2) * 16; }
  const uint8_t* nib_mn(int64_t j, int64_t pair) const { return reinterpret_cast<const uint8_t*>(imn) + (j * P2 + pair) * 16; }
  const uint16_t* nib_d(int64_t j, int64_t gi) const { return dsc + (j * spans + gi / kNibbleSpan) * 16; }
  const uint16_t* nib_dmin(int64_t j, int64_t run) const { return dmn + (j * spans + run / 2) * 16; }
  const int8_t* isc_at(int64_t j, int64_t gi) const { return isc + (j * runs * kIMinRun + gi) * 16; }
  const uint16_t* dsc_at(int64_t j, int64_t gi) const { return dsc + (j * runs + gi / kIMinRun) * 16; }
  const int8_t* imn_pair(int64_t j, int64_t pair) const { return imn + (j * P2 + pair) * 32; }  // [16][2]
  const uint16_t* dmn_run(int64_t j, int64_t run) const { return dmn + (j * runs + run) * 16; }
  // The dmin of panel j's run of kIMinRun groups, in either form.
  const uint16_t* dmin_at(int64_t j, int64_t run) const { return nib ? nib_dmin(j, run) : dmn_run(j, run); }
};

// How far ahead an int kernel's decode tile prefetches its (sequential) panel stream, into L2 (2, 4, 8, 16 KiB
// tried on a Zen 5, paired A/B: 4 KiB best; docs/performance.md, "Decisions").
constexpr int64_t kDecodePrefetchBytes = 4096;
// The AVX2 int4 decode loops twice as far (Zen 4, paired: 0.83-0.97 of 4 KiB's time; AVX-512 there: no clear change).
constexpr int64_t kAvx2Int4PrefetchBytes = 8192;
// And how far ahead it prefetches into L1 besides: paired on Zen 4, int8 at 2 KiB 0.936 of 1 KiB's time, int4 at 512 B
// 0.89-0.91 of 256 B's (docs/performance.md, "Decisions").
template <bool kInt4>
constexpr int64_t kDecodeL1Bytes = kInt4 ? 512 : 2048;

// Decode's prefetch of each panel's scale-group side data (fp32 or integer-form scales, fp32 or integer mins, zero
// points), kSideAhead groups ahead of use (past the panel's last group: the next panel's, which decode reads next).
// Decode prefetches the panels itself; without this, the scale loads of Q4_0 decode held a third of its kernel's
// samples. mins_nj >= 0: the kernel reads the integer mins in one pass (int_mins_term, int_mins_term_ymm), not
// per group: their imins and dmins come a line a group from the panel's middle group on, this block's (0: AVX-512,
// whose pass follows its groups) or those of the block mins_nj ahead, the next tile's (AVX2, whose pass precedes
// them).
struct GroupSidePrefetch {
  static constexpr int64_t kSideAhead = 16;
  const IntFormBlock& f;
  const ScaleIndex& sx;
  const char* scales;  // fp32 or fp16 (scale_bytes each)
  int64_t scale_bytes;
  const float* mins;
  const uint8_t* zeros;
  bool imins;  // integer mins read per group (split codes; IntAvx2's decode reads them before its groups)
  const char* next_mn = nullptr;  // the imins, then the dmins, that at() prefetches (mins_nj >= 0)
  const char* next_dmn = nullptr;
  int64_t first = 0, mn_lines = 0, dmn_lines = 0;
  GroupSidePrefetch(const PackedExperts& w, const IntFormBlock& f_, const ScaleIndex& sx_, bool group_imins = false,
                    int64_t mins_nj = -1)
      : f(f_), sx(sx_), scales(f_.isc ? nullptr : w.scales.as<char>()), scale_bytes(w.half_scales ? 2 : 4),
        mins(w.has_mins && !w.imin_groups ? w.mins.as<float>() : nullptr), zeros(w.has_zeros ? w.zeros.data() : nullptr),
        imins(group_imins && f_.imn) {
    if (mins_nj < 0 || !f.imn || imins) return;
    const int64_t mn_bytes = f.P2 * (f.nib ? 16 : 32), dmn_bytes = (f.nib ? f.spans : f.runs) * 32;
    next_mn = reinterpret_cast<const char*>(f.imn) + mins_nj * mn_bytes;
    next_dmn = reinterpret_cast<const char*>(f.dmn) + mins_nj * dmn_bytes;
    first = sx.G / 2, mn_lines = (mn_bytes + 63) / 64, dmn_lines = (dmn_bytes + 63) / 64;
  }
  template <int NJ>
  void at(int64_t gi) const {
    if (const int64_t l = gi - first; next_mn && l >= 0 && l < mn_lines + dmn_lines)
      __builtin_prefetch(l < mn_lines ? next_mn + l * 64 : next_dmn + (l - mn_lines) * 64, 0, 3);
    const int64_t ga = gi + kSideAhead;
    _Pragma("GCC unroll 16") for (int j = 0; j < NJ; ++j) {
      const int64_t si = sx(j, ga);
      if (scales) __builtin_prefetch(scales + si * scale_bytes, 0, 3);
      else if (f.nib) __builtin_prefetch(f.nib_sc(j, ga), 0, 3), __builtin_prefetch(f.nib_d(j, ga), 0, 3);
      else __builtin_prefetch(f.isc_at(j, ga), 0, 3), __builtin_prefetch(f.dsc_at(j, ga), 0, 3);
      if (mins) __builtin_prefetch(mins + si, 0, 3);
      if (zeros) __builtin_prefetch(zeros + si, 0, 3);
      if (imins && f.nib) __builtin_prefetch(f.nib_mn(j, ga / 2), 0, 3), __builtin_prefetch(f.nib_dmin(j, ga / kIMinRun), 0, 3);
      else if (imins) __builtin_prefetch(f.imn_pair(j, ga / 2), 0, 3), __builtin_prefetch(f.dmn_run(j, ga / kIMinRun), 0, 3);
    }
  }
};

// Valid columns of block b (the last block of a matrix may be cut at N).
inline int valid_cols(const PackedExperts& w, int64_t b) {
  return int(std::min<int64_t>(16, w.out_features - 16 * b));
}

MOE_ISA_END
