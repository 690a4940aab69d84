// bind_routing.cpp — select_experts.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "array_checks.h"
#include "moe_cpu/routing.h"

namespace py = pybind11;
using namespace moe_cpu;
using namespace moe_cpu::py_checks;

void bind_routing(py::module_& m) {
  m.def("select_experts", [](py::handle l_h, int64_t top_k, bool renormalize, const std::string& scoring,
                             bool grouped, int64_t G, int64_t T, py::handle bias_h, double factor) {
    auto l = array_arg(l_h, "router_logits", {ElemType::kF32}, 2);
    const int64_t M = l.shape(0), E = l.shape(1);
    RoutingArgs a;
    a.top_k = top_k, a.renormalize = renormalize, a.grouped = grouped;
    a.num_expert_group = G, a.topk_group = T, a.routed_scaling_factor = factor;
    if (scoring != "softmax" && scoring != "sigmoid")
      throw ValueError(msg("scoring_func = '", scoring, "' must be 'softmax' or 'sigmoid'"));
    a.sigmoid = scoring == "sigmoid";
    py::array bias;
    if (!bias_h.is_none()) {
      bias = array_arg(bias_h, "e_score_correction_bias", {ElemType::kF32}, 1);
      require_shape(bias, "e_score_correction_bias", {E}, "[num_experts]");
      a.correction_bias = static_cast<const float*>(bias.data());
    }
    if (top_k < 1 || top_k > E)
      throw ValueError(msg("top_k = ", top_k, " must be in [1, num_experts = ", E, "]"));
    py::array_t<float> w({M, top_k});
    py::array_t<int32_t> ids({M, top_k});
    float* wd = w.mutable_data();
    int32_t* idd = ids.mutable_data();
    const float* ld = static_cast<const float*>(l.data());
    {
      py::gil_scoped_release nogil;
      select_experts(ld, M, E, a, wd, idd);
    }
    return py::make_tuple(w, ids);
  }, py::arg("router_logits"), py::arg("top_k"), py::arg("renormalize"), py::arg("scoring_func"),
     py::arg("use_grouped_topk"), py::arg("num_expert_group"), py::arg("topk_group"),
     py::arg("e_score_correction_bias"), py::arg("routed_scaling_factor"));
}
