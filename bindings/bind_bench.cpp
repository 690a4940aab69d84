// bind_bench.cpp — machine limits for the benchmark: read bandwidth, and the register-only peak of
// each instruction the kernels are made of (the x86-64 list; empty elsewhere).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bench/machine_limits.h"
#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace py = pybind11;

void bind_bench(py::module_& m) {
  using namespace moe_cpu::bench;
#if defined(__x86_64__) || defined(_M_X64)
  // The calling thread's MXCSR: the kt peer restores it after loading kt's module, which sets FTZ / DAZ.
  m.def("mxcsr", [] { return _mm_getcsr(); });
  m.def("set_mxcsr", [](unsigned v) { _mm_setcsr(v); }, py::arg("value"));
#endif
  struct Buffer {
    ReadBuffer* b;
    explicit Buffer(size_t n) : b(make_read_buffer(n)) {}
    ~Buffer() { free_read_buffer(b); }
  };
  py::class_<Buffer>(m, "ReadBuffer", "A first-touched buffer for read-bandwidth measurements.")
      .def(py::init<size_t>(), py::arg("bytes"))
      .def("read_gbs", [](Buffer& self, int threads, int reps) {
        if (threads < 1 || reps < 1) throw moe_cpu::ValueError("threads and reps must be >= 1");
        py::gil_scoped_release nogil;
        return read_bandwidth_gbs(self.b, threads, reps);
      }, py::arg("threads"), py::arg("reps"), "Best GB/s of `reps` full passes with the widest aligned loads.");
  m.def("peak_instructions", [] {
    py::list out;
    for (const PeakInsn& p : peak_instructions()) {
      py::dict d;
      d["name"] = p.name, d["what"] = p.what, d["ops"] = p.ops;
      d["available"] = (p.features & ~moe_cpu::detected_features()) == 0;
      out.append(d);
    }
    return out;
  }, "The instructions whose peak instruction_peak_tops measures: name, what, ops per instruction "
     "(chain), available on this CPU.");
  m.def("instruction_peak_tops", [](const std::string& name, int threads, double seconds) {
    py::gil_scoped_release nogil;
    return instruction_peak_tops(name, threads, seconds);
  }, py::arg("name"), py::arg("threads"), py::arg("seconds") = 0.3,
     "Register-only peak of one instruction (chain) in tera-ops/s (2 per multiply-add), all threads.");
}
