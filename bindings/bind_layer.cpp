// bind_layer.cpp — the whole MoELayer in one call (LayerPlan, moe_layer), and the router's own GEMMs
// (router_logits, shared_gate) that moe_cpu.router.Router uses, so the blocking layer, a layer on a Stream and
// Router.route give the same bits. MoELayer checks the plan's arguments; these check shapes and dtypes again.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "array_checks.h"
#include "layer_call.h"
#include "moe_cpu/errors.h"

namespace py = pybind11;
using namespace moe_cpu;
using namespace moe_cpu::py_checks;

namespace {

const float* f32_arg(py::handle h, const char* name, std::vector<int64_t> dims, const char* expect, py::list& keep) {
  if (h.is_none()) return nullptr;
  auto a = array_arg(h, name, {ElemType::kF32}, int(dims.size()));
  require_shape(a, name, dims, expect);
  keep.append(a);
  return static_cast<const float*>(a.data());
}

}  // namespace

LayerCall moe_cpu::prepare_layer(const LayerPlan& p, py::handle x_h) {
  LayerCall c;
  c.args = p.args;
  FusedMoeArgs& e = c.args.experts;
  c.x = hidden_arg(x_h, "x", &e.dtype);
  if (c.x.shape(1) != e.H) throw ValueError(msg("x has shape ", shape_str(c.x), " but [M, H=", e.H, "] was expected"));
  e.M = c.x.shape(0);
  c.out = py::array(c.x.dtype(), {c.x.shape(0), c.x.shape(1)});
  e.x = c.x.data(), e.out = c.out.mutable_data();
  return c;
}

void bind_layer(py::module_& m) {
  py::class_<LayerPlan>(m, "LayerPlan")
      .def(py::init([](py::handle gate_h, py::handle gate_bias_h, int64_t top_k, bool renormalize,
                       const std::string& scoring, bool grouped, int64_t G, int64_t T, py::handle corr_h,
                       double factor, py::handle w13_h, py::handle w2_h, py::handle b13_h, py::handle b2_h,
                       const std::string& activation, py::handle s13_h, py::handle s2_h, py::handle sgate_h) {
             LayerPlan p;
             py::list keep;
             p.w13 = packed_arg(w13_h, "w13"), p.w2 = packed_arg(w2_h, "w2");
             check_scheme_pair(*p.w13, *p.w2, "the layer");
             const int64_t E = p.w13->num_experts, H = p.w13->in_features;
             FusedMoeArgs& e = p.args.experts;
             e.H = H, e.w13 = p.w13.get(), e.w2 = p.w2.get(), e.activation = parse_activation(activation);
             e.w13_bias = f32_arg(b13_h, "w13_bias", {E, p.w13->out_features}, "[E, 2I]", keep);
             e.w2_bias = f32_arg(b2_h, "w2_bias", {E, H}, "[E, H]", keep);
             p.args.gate = f32_arg(gate_h, "gate", {E, H}, "[E, H]", keep);
             if (!p.args.gate) throw TypeError("gate must be a float32 array [E, H]");
             py::array_t<uint16_t> g16({E, H});  // a gate of bf16 values: the router reads half the bytes
             if (gate_as_bf16(p.args.gate, E * H, g16.mutable_data())) keep.append(g16), p.args.gate_bf16 = g16.data();
             p.args.gate_bias = f32_arg(gate_bias_h, "gate_bias", {E}, "[E]", keep);
             RoutingArgs& r = p.args.routing;
             if (top_k < 1 || top_k > E) throw ValueError(msg("top_k = ", top_k, " must be in [1, num_experts = ", E, "]"));
             if (scoring != "softmax" && scoring != "sigmoid")
               throw ValueError(msg("scoring_func = '", scoring, "' must be 'softmax' or 'sigmoid'"));
             r.top_k = top_k, r.renormalize = renormalize, r.sigmoid = scoring == "sigmoid", r.grouped = grouped;
             r.num_expert_group = G, r.topk_group = T, r.routed_scaling_factor = factor;
             r.correction_bias = f32_arg(corr_h, "e_score_correction_bias", {E}, "[E]", keep);
             if (!s13_h.is_none() || !s2_h.is_none()) {
               p.s13 = packed_arg(s13_h, "shared_w13"), p.s2 = packed_arg(s2_h, "shared_w2");
               check_scheme_pair(*p.s13, *p.s2, "the shared expert");
               p.args.shared_w13 = p.s13.get(), p.args.shared_w2 = p.s2.get();
             }
             p.args.shared_gate = f32_arg(sgate_h, "shared_expert_gate", {H}, "[H]", keep);
             if (p.args.shared_gate && !p.s13) throw ValueError("shared_expert_gate needs a shared expert");
             p.arrays = keep;
             return p;
           }),
           py::arg("gate"), py::arg("gate_bias"), py::arg("top_k"), py::arg("renormalize"), py::arg("scoring_func"),
           py::arg("use_grouped_topk"), py::arg("num_expert_group"), py::arg("topk_group"),
           py::arg("e_score_correction_bias"), py::arg("routed_scaling_factor"), py::arg("w13"), py::arg("w2"),
           py::arg("w13_bias"), py::arg("w2_bias"), py::arg("activation"), py::arg("shared_w13"),
           py::arg("shared_w2"), py::arg("shared_expert_gate"))
      .def_property_readonly("gate_bf16", [](const LayerPlan& p) { return p.args.gate_bf16 != nullptr; },
                             "whether the router reads the gate as bf16 (every value is one: the same logits)");

  m.def("moe_layer", [](const LayerPlan& p, py::handle x_h) {
    LayerCall c = prepare_layer(p, x_h);
    {
      py::gil_scoped_release nogil;
      moe_layer(c.args);
    }
    return c.out;
  }, py::arg("plan"), py::arg("x"));

  m.def("router_logits", [](py::handle x_h, py::handle gate_h, py::handle bias_h) {
    DType dt;
    auto x = hidden_arg(x_h, "x", &dt);
    const int64_t M = x.shape(0), H = x.shape(1);
    auto gate = array_arg(gate_h, "gate", {ElemType::kF32}, 2);
    require_shape(gate, "gate", {-1, H}, "[E, H] with H from x");
    const int64_t E = gate.shape(0);
    py::list keep;
    const float* b = f32_arg(bias_h, "gate_bias", {E}, "[E]", keep);
    py::array_t<float> out({M, E});
    const void* xd = x.data();
    const float* gd = static_cast<const float*>(gate.data());
    float* od = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      router_logits(xd, dt, M, H, gd, E, b, od);
    }
    return out;
  }, py::arg("x"), py::arg("gate"), py::arg("gate_bias"));

  m.def("shared_gate", [](py::handle x_h, py::handle w_h) {
    DType dt;
    auto x = hidden_arg(x_h, "x", &dt);
    const int64_t M = x.shape(0), H = x.shape(1);
    py::list keep;
    const float* w = f32_arg(w_h, "shared_expert_gate", {H}, "[H] with H from x", keep);
    if (!w) throw TypeError("shared_expert_gate must be a float32 array [H]");
    py::array_t<float> out(M);
    const void* xd = x.data();
    float* od = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      shared_gate(xd, dt, M, H, w, od);
    }
    return out;
  }, py::arg("x"), py::arg("shared_expert_gate"));
}
