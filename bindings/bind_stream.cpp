// bind_stream.cpp — Stream and its pending tasks (moe_cpu/stream.py wraps them). A task's arguments are checked
// at submit, as fused_experts checks them; the worker runs the compute without the GIL and never touches a
// Python object: the Python task object holds the arrays until it is dropped (after the task has run).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "fused_call.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/stream.h"

namespace py = pybind11;
using namespace moe_cpu;

namespace {

struct PyTask {
  std::shared_ptr<StreamTask> task;
  py::object arrays;
  py::array out;
};

}  // namespace

void bind_stream(py::module_& m) {
  py::class_<PyTask>(m, "StreamTask")
      .def("done", [](const PyTask& t) { return t.task->done(); })
      .def("wait", [](const PyTask& t, double timeout_s) {
        bool ran;
        {
          py::gil_scoped_release nogil;
          ran = t.task->wait(timeout_s);
        }
        return ran ? py::object(t.out) : py::object(py::none());
      }, py::arg("timeout_s"));
  py::class_<Stream, std::shared_ptr<Stream>>(m, "Stream")
      .def(py::init<int64_t, int64_t>(), py::arg("num_threads"), py::arg("spin_us"))
      .def("submit_fused", [](Stream& s, py::handle x_h, py::handle w13_h, py::handle w2_h, py::handle tw_h,
                              py::handle ti_h, const std::string& activation, bool on_input, py::handle b13_h,
                              py::handle b2_h, py::handle map_h, py::handle out_h, bool inplace) {
        if (s.closed()) throw ValueError("this Stream is closed: submit to an open one");
        FusedCall c = prepare_fused(x_h, w13_h, w2_h, tw_h, ti_h, activation, on_input, b13_h, b2_h, map_h, out_h,
                                    inplace);
        check_fused_experts(c.args);  // argument errors raise here, and nothing is queued
        const FusedMoeArgs a = c.args;
        const Ptr w13 = c.w13, w2 = c.w2;
        auto task = std::make_shared<StreamTask>([a, w13, w2] { fused_experts(a); });
        s.submit(task);
        return PyTask{task, c.arrays, c.out};
      })
      .def("sync", [](Stream& s) {
        py::gil_scoped_release nogil;
        s.sync();
      })
      .def("close", [](Stream& s) {
        py::gil_scoped_release nogil;
        s.close();
      })
      .def_property_readonly("closed", &Stream::closed)
      .def_property_readonly("num_threads", &Stream::num_threads)
      .def_property_readonly("spin_us", &Stream::spin_us);
}
