// registry.h — kernel descriptors. A kernel file exports one constant KernelDesc; kernels.def
// lists them best first; the first one whose features are active is chosen at pack time.
#pragma once
#include <cstdint>
#include <vector>

#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

// Activations of `rows` rows, ready for one GEMM with inner dimension K.
struct ActRows {
  int64_t rows = 0, K = 0;
  const int8_t* q = nullptr;        // int schemes: [rows, K] codes
  const float* scale = nullptr;     //   and one scale per row
  const uint16_t* bf16 = nullptr;   // bf16 / fp8 schemes: [rows, K] bf16 bits
};

struct KernelDesc {
  const char* name;       // "<precision>_<isa>[_<MR>x<NR>]", also the test and bench name
  Scheme scheme;
  const char* isa;
  int mr, nr;             // register tile (1x1 for the reference)
  uint64_t features;      // CpuFeature bits it needs
  // c[r*ldc + n] = sum over k of a[r,k] * W[e][n,k] with the scheme's numerics, r < rows, n < N.
  void (*gemm)(const PackedExperts& w, int64_t e, const ActRows& a, float* c, int64_t ldc);
};

// Best registered kernel for `s` under the active features (the reference always qualifies).
const KernelDesc* select_kernel(Scheme s);
// Every registered kernel, best first.
const std::vector<const KernelDesc*>& all_kernels();

}  // namespace moe_cpu
