// int_forms.h — the scales' blocked order ([E][NB][G][16], scale_index) and the integer forms of int scales
// and mins: every run of kIMinRun groups of a column factored exactly as d * integer (K-quants, IQ4_XS), for
// the kernels that read them (KernelDesc::int_mins / int_scales). The index arithmetic of each form is
// PackedExperts' (imin_index, iscale_index, ...), inline there because kernels call it per group.
#pragma once
#include <algorithm>
#include <cstdint>

#include "common/parallel.h"
#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

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

// Builds the integer mins when p.kernel takes them and every run of 8 groups factors exactly
// (a no-op otherwise). Called by the packers and load_packed once the kernel is chosen.
void derive_int_mins(PackedExperts& p);
// The float mins in the scales' blocked order (from the integer form when the float ones were dropped).
AlignedBuffer float_mins(const PackedExperts& p);
// Builds the integer scales when p.kernel takes them (int4 groups) and every run of 8 groups factors
// exactly as d * int8 (a no-op otherwise). Called with derive_int_mins.
void derive_int_scales(PackedExperts& p);
// The float scales in their blocked order (from the integer form when the float ones were dropped).
AlignedBuffer float_scales(const PackedExperts& p);
// Runs p with kernel kd from now on: scales and mins take the form kd reads (tests run every kernel).
void set_kernel(PackedExperts& p, const KernelDesc* kd);

}  // namespace moe_cpu
