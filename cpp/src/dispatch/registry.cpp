// registry.cpp — builds the kernel list from kernels.def and picks one per scheme.
#include "dispatch/registry.h"

#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"

namespace moe_cpu {

#define MOE_KERNEL(prec, isa) extern const KernelDesc kernel_##prec##_##isa;
#include "dispatch/kernels.def"
#undef MOE_KERNEL

const std::vector<const KernelDesc*>& all_kernels() {
  static const std::vector<const KernelDesc*> list = {
#define MOE_KERNEL(prec, isa) &kernel_##prec##_##isa,
#include "dispatch/kernels.def"
#undef MOE_KERNEL
  };
  return list;
}

const KernelDesc* select_kernel(const PackedExperts& w) {
  const uint64_t active = active_features();
  for (const KernelDesc* k : all_kernels())
    if (k->scheme == w.run_scheme() && (k->features & active) == k->features && (!k->supports || k->supports(w)))
      return k;
  throw ValueError(msg("no kernel registered for scheme ", scheme_name(w.run_scheme())));
}

}  // namespace moe_cpu
