// types.h — enums shared by the whole core: weight schemes, activations, element types.
#pragma once
#include <cstdint>
#include <string>

namespace moe_cpu {

// The A16 int schemes hold the weights of their A8 twins and keep 16-bit activations (int16 codes).
enum class Scheme : int { kInt4W4A8 = 0, kInt8W8A8 = 1, kFp8W8A16 = 2, kBf16 = 3, kInt4W4A16 = 4, kInt8W8A16 = 5 };
enum class Activation : int {
  kSilu = 0, kGelu, kGeluTanh, kSwigluStep, kSwigluOai, kSwigluOaiUninterleave
};
enum class DType : int { kF32 = 0, kBf16 = 1 };  // element type of hidden states / outputs

// "int4_w4a8" <-> Scheme and "silu" <-> Activation; parse_* throw ValueError naming `arg`.
const char* scheme_name(Scheme s);
Scheme parse_scheme(const std::string& name, const char* arg = "scheme");
const char* activation_name(Activation a);
Activation parse_activation(const std::string& name, const char* arg = "activation");

// The weights' scheme: the A8 twin of an A16 int scheme (what PackedExperts::scheme holds), else s.
inline Scheme weight_scheme(Scheme s) {
  return s == Scheme::kInt4W4A16 ? Scheme::kInt4W4A8 : s == Scheme::kInt8W8A16 ? Scheme::kInt8W8A8 : s;
}
// True for the schemes with integer weights (int4 / int8, A8 or A16).
inline bool is_int_scheme(Scheme s) {
  s = weight_scheme(s);
  return s == Scheme::kInt4W4A8 || s == Scheme::kInt8W8A8;
}
// True for the int schemes that keep 16-bit activations.
inline bool is_a16_scheme(Scheme s) { return s == Scheme::kInt4W4A16 || s == Scheme::kInt8W8A16; }
// The scheme that runs int weights of scheme w (A8) with 16-bit activations when a16.
inline Scheme run_scheme(Scheme w, bool a16) {
  return !a16 ? w : w == Scheme::kInt4W4A8 ? Scheme::kInt4W4A16 : w == Scheme::kInt8W8A8 ? Scheme::kInt8W8A16 : w;
}

}  // namespace moe_cpu
