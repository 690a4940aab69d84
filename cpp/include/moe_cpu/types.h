// types.h — enums shared by the whole core: weight schemes, activations, element types.
#pragma once
#include <cstdint>
#include <string>

namespace moe_cpu {

enum class Scheme : int { kInt4W4A8 = 0, kInt8W8A8 = 1, kFp8W8A16 = 2, kBf16 = 3 };
enum class Activation : int {
  kSilu = 0, kGelu, kGeluTanh, kSwigluStep, kSwigluOai, kSwigluOaiUninterleave
};
enum class DType : int { kF32 = 0, kBf16 = 1 };  // element type of hidden states / outputs

// "int4_w4a8" <-> Scheme and "silu" <-> Activation; parse_* throw ValueError naming `arg`.
const char* scheme_name(Scheme s);
Scheme parse_scheme(const std::string& name, const char* arg = "scheme");
const char* activation_name(Activation a);
Activation parse_activation(const std::string& name, const char* arg = "activation");

// True for the schemes whose activations are quantized to int8 per row.
inline bool is_int_scheme(Scheme s) { return s == Scheme::kInt4W4A8 || s == Scheme::kInt8W8A8; }

}  // namespace moe_cpu
