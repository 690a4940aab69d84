// layer_call.h — a MoELayer as the bindings hold it (bind_layer.cpp), shared with the Stream binding: the plan
// (weights, router, routing; built once per layer) and one call of it on hidden states.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "fused_call.h"
#include "moe_cpu/layer.h"

namespace moe_cpu {

struct LayerPlan {
  MoeLayerArgs args;            // everything but the hidden states and the output
  Ptr w13, w2, s13, s2;         // the packed weights, kept alive by the plan
  pybind11::object arrays;      // gate, biases, correction bias, shared-expert gate
};

struct LayerCall {
  MoeLayerArgs args;
  pybind11::array x, out;
};

// x checked ([M, H] float32 / bf16 bits, C-contiguous) and a new output like it.
LayerCall prepare_layer(const LayerPlan& p, pybind11::handle x);

}  // namespace moe_cpu
