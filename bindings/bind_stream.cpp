// bind_stream.cpp — Stream and its pending tasks (moe_cpu/stream.py wraps them). A task's arguments are checked
// at submit, as fused_experts checks them; the worker runs the compute without the GIL and never touches a
// Python object: the Python task object holds the arrays until it is dropped (after the task has run).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "fused_call.h"
#include "layer_call.h"
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

// A captured call on fixed buffers, replayed by moe_cpu_host_submit / moe_cpu_host_wait from any thread without
// Python: each replay runs fused_experts on what the buffers hold then. Its address is the callbacks' context;
// the live set refuses a context whose capture was freed (or was never one).
struct Capture {
  std::shared_ptr<Stream> stream;
  FusedMoeArgs args;
  Ptr w13, w2;
  py::object arrays;
  py::array out;
  std::mutex mu;
  std::shared_ptr<StreamTask> last;
  std::string error;  // the last replay's error ("" if none)
  uint64_t replays = 0;
};

std::mutex g_live_mu;
std::unordered_set<const void*> g_live;

bool is_live(const void* ctx) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  return g_live.count(ctx) > 0;
}

}  // namespace

extern "C" {
// cudaLaunchHostFunc-style callbacks (void fn(void*)): queue one replay of the capture, or wait for the last one.
__attribute__((visibility("default"))) void moe_cpu_host_submit(void* ctx) {
  if (!is_live(ctx)) {
    std::fprintf(stderr, "moe_cpu_host_submit: context %p is not a live capture (freed?): ignored\n", ctx);
    return;
  }
  Capture* c = static_cast<Capture*>(ctx);
  auto t = std::make_shared<StreamTask>([c] { fused_experts(c->args); });
  std::lock_guard<std::mutex> lock(c->mu);
  try {
    c->stream->submit(t);
    c->last = t, ++c->replays;
  } catch (const std::exception& e) {
    c->error = e.what();
  }
}
__attribute__((visibility("default"))) void moe_cpu_host_wait(void* ctx) {
  if (!is_live(ctx)) {
    std::fprintf(stderr, "moe_cpu_host_wait: context %p is not a live capture (freed?): ignored\n", ctx);
    return;
  }
  Capture* c = static_cast<Capture*>(ctx);
  std::shared_ptr<StreamTask> t;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    t = c->last;
  }
  if (!t) return;
  std::string err;
  try {
    t->wait(-1);
  } catch (const std::exception& e) {
    err = e.what();
  }
  std::lock_guard<std::mutex> lock(c->mu);
  if (t == c->last) c->error = err;
}
}

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
  py::class_<Capture, std::unique_ptr<Capture, py::nodelete>>(m, "Capture")
      .def_property_readonly("context", [](const Capture& c) { return reinterpret_cast<uintptr_t>(&c); })
      .def_property_readonly("host_submit", [](const Capture&) { return reinterpret_cast<uintptr_t>(&moe_cpu_host_submit); })
      .def_property_readonly("host_wait", [](const Capture&) { return reinterpret_cast<uintptr_t>(&moe_cpu_host_wait); })
      .def_property_readonly("out", [](const Capture& c) { return c.out; })
      .def_property_readonly("replays", [](Capture& c) {
        std::lock_guard<std::mutex> lock(c.mu);
        return c.replays;
      })
      .def("last_error", [](Capture& c) {
        std::lock_guard<std::mutex> lock(c.mu);
        return c.error;
      })
      .def("free", [](Capture& c) {  // waits for the last replay, then forgets the context
        {
          std::lock_guard<std::mutex> lock(g_live_mu);
          if (!g_live.erase(&c)) return;
        }
        std::shared_ptr<StreamTask> t;
        {
          std::lock_guard<std::mutex> lock(c.mu);
          t = c.last;
        }
        if (t) {
          py::gil_scoped_release nogil;
          try {
            t->wait(-1);
          } catch (...) {
          }
        }
        delete &c;
      });
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
      .def("submit_layer", [](Stream& s, py::handle plan_h, py::handle x_h) {
        if (s.closed()) throw ValueError("this Stream is closed: submit to an open one");
        const LayerPlan& p = py::cast<const LayerPlan&>(plan_h);
        LayerCall c = prepare_layer(p, x_h);
        check_moe_layer(c.args);  // argument errors raise here, and nothing is queued
        const MoeLayerArgs a = c.args;
        const Ptr w13 = p.w13, w2 = p.w2, s13 = p.s13, s2 = p.s2;
        auto task = std::make_shared<StreamTask>([a, w13, w2, s13, s2] { moe_layer(a); });
        s.submit(task);
        return PyTask{task, py::make_tuple(plan_h, c.x), c.out};  // the plan holds the layer's arrays
      })
      .def("capture_fused", [](std::shared_ptr<Stream> s, py::handle x_h, py::handle w13_h, py::handle w2_h,
                               py::handle tw_h, py::handle ti_h, const std::string& activation, bool on_input,
                               py::handle b13_h, py::handle b2_h, py::handle map_h, py::handle out_h) {
        if (s->closed()) throw ValueError("this Stream is closed: capture on an open one");
        for (auto [h, name] : {std::pair{x_h, "hidden_states"}, {tw_h, "topk_weights"}, {ti_h, "topk_ids"}, {out_h, "out"}})
          if (py::isinstance<py::array>(h) && !py::cast<py::array>(h).writeable())
            throw ValueError(msg("capture: ", name, " is read-only; the buffers of a capture are written between replays"));
        FusedCall call = prepare_fused(x_h, w13_h, w2_h, tw_h, ti_h, activation, on_input, b13_h, b2_h, map_h, out_h,
                                       false);
        check_scheme_pair(*call.w13, *call.w2, "capture");
        auto* c = new Capture;
        c->stream = s, c->args = call.args, c->w13 = call.w13, c->w2 = call.w2, c->arrays = call.arrays;
        c->out = call.out;
        std::lock_guard<std::mutex> lock(g_live_mu);
        g_live.insert(c);
        return std::unique_ptr<Capture, py::nodelete>(c);
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
