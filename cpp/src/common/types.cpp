// types.cpp — names of schemes and activations.
#include "moe_cpu/types.h"

#include "moe_cpu/errors.h"

namespace moe_cpu {
namespace {
constexpr const char* kSchemes[] = {"int4_w4a8", "int8_w8a8", "fp8_w8a16", "bf16", "int4_w4a16", "int8_w8a16"};
constexpr const char* kActs[] = {"silu",      "gelu",      "gelu_tanh",
                                 "swiglustep", "swigluoai", "swigluoai_uninterleave"};

template <size_t N>
int find(const char* const (&names)[N], const std::string& s, const char* arg, const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return int(i);
  std::string all;
  for (const char* n : names) all += std::string(all.empty() ? "" : ", ") + "'" + n + "'";
  throw ValueError(msg(arg, " = '", s, "' is not a known ", what, " (expected one of ", all, ")"));
}
}  // namespace

const char* scheme_name(Scheme s) { return kSchemes[int(s)]; }
Scheme parse_scheme(const std::string& n, const char* arg) {
  return Scheme(find(kSchemes, n, arg, "scheme"));
}
const char* activation_name(Activation a) { return kActs[int(a)]; }
Activation parse_activation(const std::string& n, const char* arg) {
  return Activation(find(kActs, n, arg, "activation"));
}

}  // namespace moe_cpu
