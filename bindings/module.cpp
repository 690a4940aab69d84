// module.cpp — the moe_cpu._core extension: exception mapping and the bind_* areas.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/fused_moe.h"
#include "moe_cpu/threads.h"

namespace py = pybind11;

void bind_pack(py::module_& m);
void bind_moe(py::module_& m);
void bind_routing(py::module_& m);
void bind_bench(py::module_& m);
void bind_dlpack(py::module_& m);
void bind_stream(py::module_& m);
void bind_layer(py::module_& m);

PYBIND11_MODULE(_core, m) {
  m.doc() = "moe_cpu C++ core (use the moe_cpu package, not this module directly)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const moe_cpu::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const moe_cpu::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  bind_pack(m);
  bind_moe(m);
  bind_routing(m);
  bind_bench(m);
  bind_dlpack(m);
  bind_stream(m);
  bind_layer(m);
  m.def("set_num_threads", &moe_cpu::set_num_threads, py::arg("n"));
  m.def("get_num_threads", &moe_cpu::get_num_threads);
  moe_cpu::compute_team();  // a bad MOE_CPU_TEAM / MOE_CPU_SPIN_US fails the import, naming the variable
  m.def("compute_team", &moe_cpu::compute_team);
  m.def("set_scratch_limit", &moe_cpu::set_scratch_limit, py::arg("bytes"));
  m.def("get_scratch_limit", &moe_cpu::get_scratch_limit);
  m.def("detected_features", [] { return moe_cpu::feature_names(moe_cpu::detected_features()); });
  m.def("active_features", [] { return moe_cpu::feature_names(moe_cpu::active_features()); });
  m.def("force_isa", &moe_cpu::force_isa, py::arg("isa"));
  m.def("forced_isa", &moe_cpu::forced_isa);
  m.def("amx_status", &moe_cpu::amx_status);
  m.def("amx_min_rows", &moe_cpu::amx_min_rows);
  m.def("amx_min_rows_set", &moe_cpu::amx_min_rows_set);
  m.def("amx_min_rows_float", &moe_cpu::amx_min_rows_float);
  m.def("set_amx_min_rows", &moe_cpu::set_amx_min_rows, py::arg("rows"));
  m.def("reset_amx_min_rows", &moe_cpu::reset_amx_min_rows);
}
