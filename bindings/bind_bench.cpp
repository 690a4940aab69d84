// bind_bench.cpp — machine limits for the benchmark (x86-64 only; elsewhere the names raise).
#include <pybind11/pybind11.h>

#include "moe_cpu/errors.h"

#if defined(__x86_64__)
#include "bench/machine_limits.h"
#endif

namespace py = pybind11;

void bind_bench(py::module_& m) {
#if defined(__x86_64__)
  using namespace moe_cpu::bench;
  struct Buffer {
    ReadBuffer* b;
    explicit Buffer(size_t n) : b(make_read_buffer(n)) {}
    ~Buffer() { free_read_buffer(b); }
  };
  py::class_<Buffer>(m, "ReadBuffer", "A first-touched buffer for read-bandwidth measurements.")
      .def(py::init<size_t>(), py::arg("bytes"))
      .def("read_gbs", [](Buffer& self, int threads, int reps) {
        py::gil_scoped_release nogil;
        return read_bandwidth_gbs(self.b, threads, reps);
      }, py::arg("threads"), py::arg("reps"), "Best GB/s of `reps` full passes with streaming loads.");
  m.def("vpdpbusd_peak_tops", [](int threads, double seconds) {
    py::gil_scoped_release nogil;
    return vpdpbusd_peak_tops(threads, seconds);
  }, py::arg("threads"), py::arg("seconds") = 0.3);
  m.def("vdpbf16ps_peak_tflops", [](int threads, double seconds) {
    py::gil_scoped_release nogil;
    return vdpbf16ps_peak_tflops(threads, seconds);
  }, py::arg("threads"), py::arg("seconds") = 0.3);
#else
  (void)m;
#endif
}
