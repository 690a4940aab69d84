// bind_moe.cpp — fused_experts, shared_expert and moe_align_block_size; the GIL is released
// around the compute.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "array_checks.h"
#include "fused_call.h"
#include "moe_cpu/fused_moe.h"

namespace py = pybind11;
using namespace moe_cpu;
using namespace moe_cpu::py_checks;

namespace {

// The output array: `out` if given (checked), x itself if inplace, else a new array like x.
py::array output_arg(py::handle out_h, bool inplace, const py::array& x, DType dt, const char* xname) {
  if (inplace && !out_h.is_none())
    throw ValueError("pass either out= or inplace=True, not both");
  if (inplace) {
    if (!x.writeable()) throw ValueError(msg("inplace=True but ", xname, " is read-only"));
    return x;
  }
  if (out_h.is_none()) return py::array(x.dtype(), {x.shape(0), x.shape(1)});
  auto out = array_arg(out_h, "out", {dt == DType::kF32 ? ElemType::kF32 : ElemType::kU16}, 2);
  require_shape(out, "out", {x.shape(0), x.shape(1)}, std::string(std::string("the shape of ") + xname + " [M, H]").c_str());
  if (!out.writeable()) throw ValueError("out is read-only");
  return out;
}

}  // namespace

Ptr moe_cpu::packed_arg(py::handle h, const char* name) {
  if (!py::isinstance<PackedExperts>(h))
    throw TypeError(msg(name, " must be a moe_cpu.PackedExperts (from pack_* or quantize_experts), got ",
                        std::string(py::str(py::type::of(h).attr("__name__")))));
  return h.cast<Ptr>();
}

// Hidden states [M,H] float32 or bf16 bits.
py::array moe_cpu::hidden_arg(py::handle h, const char* name, DType* dt) {
  auto x = array_arg(h, name, {ElemType::kF32, ElemType::kU16}, 2);
  *dt = has_type(x, ElemType::kF32) ? DType::kF32 : DType::kBf16;
  return x;
}

FusedCall moe_cpu::prepare_fused(py::handle x_h, py::handle w13_h, py::handle w2_h, py::handle tw_h, py::handle ti_h,
                        const std::string& activation, bool on_input, py::handle b13_h, py::handle b2_h,
                        py::handle map_h, py::handle out_h, bool inplace) {
    FusedMoeArgs a;
    auto x = hidden_arg(x_h, "hidden_states", &a.dtype);
    Ptr w13 = packed_arg(w13_h, "w13"), w2 = packed_arg(w2_h, "w2");
    a.M = x.shape(0), a.H = x.shape(1);
    auto tw = array_arg(tw_h, "topk_weights", {ElemType::kF32}, 2);
    auto ti = array_arg(ti_h, "topk_ids", {ElemType::kI32, ElemType::kI64}, 2);
    require_shape(ti, "topk_ids", {a.M, -1}, "[M, k] with M from hidden_states");
    a.k = ti.shape(1);
    require_shape(tw, "topk_weights", {a.M, a.k}, "the shape of topk_ids [M, k]");
    a.activation = parse_activation(activation);
    a.apply_router_weight_on_input = on_input;
    const int64_t E = w13->num_experts;
    py::array b13, b2, map;
    if (!b13_h.is_none()) {
      b13 = array_arg(b13_h, "w13_bias", {ElemType::kF32}, 2);
      require_shape(b13, "w13_bias", {E, w13->out_features}, "[E, 2I]");
      a.w13_bias = static_cast<const float*>(b13.data());
    }
    if (!b2_h.is_none()) {
      b2 = array_arg(b2_h, "w2_bias", {ElemType::kF32}, 2);
      require_shape(b2, "w2_bias", {E, w2->out_features}, "[E, H]");
      a.w2_bias = static_cast<const float*>(b2.data());
    }
    if (!map_h.is_none()) {
      map = array_arg(map_h, "expert_map", {ElemType::kI32}, 1);
      a.expert_map = static_cast<const int32_t*>(map.data());
      a.num_global_experts = map.shape(0);
    }
    py::array out = output_arg(out_h, inplace, x, a.dtype, "hidden_states");
    require_no_overlap(out, x, "hidden_states", true);
    require_no_overlap(out, tw, "topk_weights", false);
    require_no_overlap(out, ti, "topk_ids", false);
    require_no_overlap(out, b13, "w13_bias", false);
    require_no_overlap(out, b2, "w2_bias", false);
    require_no_overlap(out, map, "expert_map", false);
    a.x = x.data(), a.w13 = w13.get(), a.w2 = w2.get();
    a.topk_weights = static_cast<const float*>(tw.data());
    a.topk_ids = ti.data(), a.ids_int64 = has_type(ti, ElemType::kI64);
    a.out = out.mutable_data();
    return FusedCall{a, w13, w2, py::make_tuple(x, tw, ti, b13, b2, map), out};
}

void bind_moe(py::module_& m) {
  m.def("fused_experts", [](py::handle x_h, py::handle w13_h, py::handle w2_h, py::handle tw_h, py::handle ti_h,
                            const std::string& activation, bool on_input, py::handle b13_h, py::handle b2_h,
                            py::handle map_h, py::handle out_h, bool inplace) {
    FusedCall c = prepare_fused(x_h, w13_h, w2_h, tw_h, ti_h, activation, on_input, b13_h, b2_h, map_h, out_h, inplace);
    {
      py::gil_scoped_release nogil;
      fused_experts(c.args);
    }
    return c.out;
  }, py::arg("hidden_states"), py::arg("w13"), py::arg("w2"), py::arg("topk_weights"), py::arg("topk_ids"),
     py::arg("activation"), py::arg("apply_router_weight_on_input"), py::arg("w13_bias"), py::arg("w2_bias"),
     py::arg("expert_map"), py::arg("out"), py::arg("inplace"));

  m.def("shared_expert", [](py::handle x_h, py::handle w13_h, py::handle w2_h, py::handle f_h, double factor,
                            py::handle out_h, bool inplace) {
    DType dt;
    auto x = hidden_arg(x_h, "hidden_states", &dt);
    Ptr w13 = packed_arg(w13_h, "w13"), w2 = packed_arg(w2_h, "w2");
    auto f = array_arg(f_h, "fused_experts_out", {dt == DType::kF32 ? ElemType::kF32 : ElemType::kU16}, 2);
    require_shape(f, "fused_experts_out", {x.shape(0), x.shape(1)}, "the shape of hidden_states [M, H]");
    check_scheme_pair(*w13, *w2, "the shared expert");
    if (w13->in_features != x.shape(1) || w2->out_features != x.shape(1) || w13->out_features != 2 * w2->in_features)
      throw ValueError(msg("shared expert shapes do not fit: w13 [1, ", w13->out_features, ", ", w13->in_features,
                           "], w2 [1, ", w2->out_features, ", ", w2->in_features, "], hidden_states H = ", x.shape(1),
                           " (need w13 [1, 2I, H] and w2 [1, H, I])"));
    if (inplace && !f.writeable()) throw ValueError("inplace=True but fused_experts_out is read-only");
    py::array out = inplace ? f : output_arg(out_h, false, x, dt, "hidden_states");
    require_no_overlap(out, f, "fused_experts_out", true);  // (hidden_states is read whole before out is written)
    const void* xd = x.data();
    const void* fd = f.data();
    void* od = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      shared_expert(xd, dt, x.shape(0), x.shape(1), *w13, *w2, fd, factor, od);
    }
    return out;
  }, py::arg("hidden_states"), py::arg("w13"), py::arg("w2"), py::arg("fused_experts_out"),
     py::arg("routed_scaling_factor"), py::arg("out"), py::arg("inplace"));

  m.def("moe_align_block_size", [](py::handle ids_h, int64_t E, int64_t block) {
    auto ids = array_arg(ids_h, "topk_ids", {ElemType::kI32}, 2);
    AlignedRows r = moe_align_block_size(static_cast<const int32_t*>(ids.data()), ids.size(), E, block);
    return py::make_tuple(py::array_t<int32_t>(py::ssize_t(r.sorted_ids.size()), r.sorted_ids.data()),
                          py::array_t<int32_t>(py::ssize_t(r.expert_ids.size()), r.expert_ids.data()),
                          r.num_tokens_post_pad);
  }, py::arg("topk_ids"), py::arg("num_experts"), py::arg("block_size"));
}
