// test_kernel_table.cpp — kernels.def is the one list of kernels: each line's descriptor names itself by the
// grammar <precision>_<isa>[_<MR>x<NR>] with its own tile, ISA word and scheme, in the registry's order.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dispatch/registry.h"

namespace moe_cpu {

#define MOE_KERNEL(prec, isa) extern const KernelDesc kernel_##prec##_##isa;
#include "dispatch/kernels.def"
#undef MOE_KERNEL

namespace {

struct Line {
  std::string prec, isa;
  const KernelDesc* desc;
};

const std::vector<Line>& lines() {
  static const std::vector<Line> v = {
#define MOE_KERNEL(prec, isa) {#prec, #isa, &kernel_##prec##_##isa},
#include "dispatch/kernels.def"
#undef MOE_KERNEL
  };
  return v;
}

Scheme scheme_of_word(const std::string& prec) {
  if (prec == "w4a8") return Scheme::kInt4W4A8;
  if (prec == "w8a8") return Scheme::kInt8W8A8;
  if (prec == "w4a16") return Scheme::kInt4W4A16;
  if (prec == "w8a16") return Scheme::kInt8W8A16;
  if (prec == "fp8w") return Scheme::kFp8W8A16;
  EXPECT_EQ(prec, "bf16") << "unknown precision word";
  return Scheme::kBf16;
}

TEST(KernelTable, EveryLineNamesItsDescriptorByTheGrammar) {
  ASSERT_EQ(lines().size(), all_kernels().size());
  for (size_t i = 0; i < lines().size(); ++i) {
    const Line& l = lines()[i];
    const KernelDesc& k = *l.desc;
    EXPECT_EQ(all_kernels()[i], l.desc) << "registry order differs from kernels.def at line " << i;
    EXPECT_EQ(std::string(k.isa), l.isa) << k.name;
    EXPECT_EQ(k.scheme, scheme_of_word(l.prec)) << k.name;
    const std::string base = l.prec + "_" + l.isa;
    if (l.isa == "reference") {
      EXPECT_EQ(std::string(k.name), base);
      EXPECT_EQ(k.mr, 1) << k.name;
      EXPECT_EQ(k.nr, 1) << k.name;
    } else {
      EXPECT_EQ(std::string(k.name), base + "_" + std::to_string(k.mr) + "x" + std::to_string(k.nr))
          << "the name must spell the descriptor's own tile";
      EXPECT_NE(k.features, 0u) << k.name << ": a SIMD kernel needs CPU features";
    }
    EXPECT_NE(k.gemm, nullptr) << k.name;
  }
}

}  // namespace
}  // namespace moe_cpu
