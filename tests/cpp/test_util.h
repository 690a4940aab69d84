// test_util.h — seeded random data and small helpers shared by the C++ tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "moe_cpu/cpu_features.h"

namespace moe_cpu::test {

// RNG seeded from the running test's full name, so every case is reproducible on its own.
inline std::mt19937 rng_for_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  return std::mt19937(uint32_t(std::hash<std::string>{}(name)));
}

inline std::vector<float> gaussian(std::mt19937& g, size_t n, float sigma = 1.f) {
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<int8_t> ints(std::mt19937& g, size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = int8_t(d(g));
  return v;
}

// "" when the active features cover `need`, else the names of those missing ("avx512, avx512_vnni").
// The scalar tile model needs no hardware: its kernels run at every level here (dispatch takes them
// only at the level amx_model).
inline std::string missing_features(uint64_t need) {
  std::string out;
  const uint64_t have = active_features() | (detected_features() & kFeatAmxModel);
  for (const auto& n : feature_names(need & ~have)) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Skips the running test when kernel `kd` needs CPU features this machine (or MOE_CPU_ISA) lacks.
#define MOE_CPU_SKIP_UNLESS_RUNNABLE(kd)                                                            \
  if (const std::string m_ = ::moe_cpu::test::missing_features((kd)->features); !m_.empty())        \
  GTEST_SKIP() << (kd)->name << " needs CPU features this machine (or MOE_CPU_ISA) lacks: " << m_

// max |a - b| / max(|b|)
inline double rel_max_err(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0, m = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    e = std::max(e, std::fabs(double(a[i]) - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return e / m;
}

}  // namespace moe_cpu::test
