// fused_call.h — fused_experts' arguments as the bindings check them (bind_moe.cpp), shared with the Stream
// binding (bind_stream.cpp): the call's args and the arrays / packed weights they point into.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "moe_cpu/fused_moe.h"

namespace moe_cpu {

using Ptr = std::shared_ptr<PackedExperts>;

struct FusedCall {
  FusedMoeArgs args;
  Ptr w13, w2;                   // the weights, kept alive by the call
  pybind11::object arrays;       // the input arrays args points into
  pybind11::array out;
};

// A PackedExperts argument (TypeError naming `name` if it is not one).
Ptr packed_arg(pybind11::handle h, const char* name);
// Hidden states [M, H], float32 or bf16 bits (TypeError / ValueError); *dt gets their dtype.
pybind11::array hidden_arg(pybind11::handle h, const char* name, DType* dt);

// Checks the arguments as fused_experts does (TypeError / ValueError) and builds the call.
FusedCall prepare_fused(pybind11::handle x, pybind11::handle w13, pybind11::handle w2, pybind11::handle tw,
                        pybind11::handle ti, const std::string& activation, bool on_input, pybind11::handle b13,
                        pybind11::handle b2, pybind11::handle map, pybind11::handle out, bool inplace);

}  // namespace moe_cpu
