// bind_dlpack.cpp — DLPack import: any CPU producer (torch, JAX, NumPy, ...) becomes a NumPy array
// that shares its memory and owns the producer's managed tensor (its deleter runs when the array
// dies). Versioned ("dltensor_versioned", DLPack >= 1.0) and legacy ("dltensor") capsules.
// The structs follow the DLPack ABI (dlpack.h, v1.x); only what the import needs is declared.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moe_cpu/errors.h"

namespace py = pybind11;
using namespace moe_cpu;

namespace {

struct DLDevice { int32_t device_type, device_id; };
struct DLDataType { uint8_t code, bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLManagedTensorVersioned {
  uint32_t major, minor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr int32_t kDLCPU = 1;
constexpr uint64_t kFlagReadOnly = 1;
enum : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6, kDLFloat8_e4m3fn = 10 };

// Owns one managed tensor; its destructor hands it back to the producer.
struct Owner {
  void* mt;
  bool versioned;
  ~Owner() {
    if (versioned) {
      auto* m = static_cast<DLManagedTensorVersioned*>(mt);
      if (m->deleter) m->deleter(m);
    } else {
      auto* m = static_cast<DLManagedTensor*>(mt);
      if (m->deleter) m->deleter(m);
    }
  }
};

// (NumPy format, kind) of a DLPack element type; kind names what uint bits stand for.
std::pair<std::string, std::string> numpy_type(const DLDataType& t, const std::string& name) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && (t.bits == 16 || t.bits == 32 || t.bits == 64)) return {"f" + std::to_string(t.bits / 8), ""};
    if (t.code == kDLInt && (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)) return {"i" + std::to_string(t.bits / 8), ""};
    if (t.code == kDLUInt && (t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64)) return {"u" + std::to_string(t.bits / 8), ""};
    if (t.code == kDLBfloat && t.bits == 16) return {"u2", "bfloat16"};
    if (t.code == kDLFloat8_e4m3fn && t.bits == 8) return {"u1", "float8_e4m3fn"};
    if (t.code == kDLBool && t.bits == 8) return {"?", ""};
  }
  throw TypeError(msg(name, " has a DLPack element type (code ", int(t.code), ", bits ", int(t.bits), ", lanes ", t.lanes,
                      ") that moe_cpu does not take (float32, bfloat16, float16, int8/32/64, uint8, float8_e4m3fn)"));
}

py::tuple from_dlpack(py::object obj, const std::string& name) {
  const py::tuple dev = obj.attr("__dlpack_device__")();
  if (dev.size() < 1 || dev[0].cast<int>() != kDLCPU)
    throw ValueError(msg(name, " is on DLPack device type ", dev.size() ? dev[0].cast<int>() : -1,
                         ", not the CPU (1); moe_cpu runs on the CPU: move it there first (e.g. .cpu())"));
  py::object cap;
  try {
    cap = obj.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    cap = obj.attr("__dlpack__")();  // a producer from before DLPack 1.0
  }
  PyObject* c = cap.ptr();
  const bool versioned = PyCapsule_IsValid(c, "dltensor_versioned");
  if (!versioned && !PyCapsule_IsValid(c, "dltensor"))
    throw TypeError(msg(name, ".__dlpack__() did not return a DLPack capsule (or it was consumed already)"));
  void* mt = PyCapsule_GetPointer(c, versioned ? "dltensor_versioned" : "dltensor");
  const DLTensor& t = versioned ? static_cast<DLManagedTensorVersioned*>(mt)->dl_tensor : static_cast<DLManagedTensor*>(mt)->dl_tensor;
  bool readonly = false;
  if (versioned) {
    const auto* m = static_cast<DLManagedTensorVersioned*>(mt);
    if (m->major != 1) throw TypeError(msg(name, " uses DLPack ", m->major, ".", m->minor, "; this build reads 1.x"));
    readonly = (m->flags & kFlagReadOnly) != 0;
  }
  if (t.device.device_type != kDLCPU)
    throw ValueError(msg(name, " is on DLPack device type ", t.device.device_type, ", not the CPU (1)"));
  auto [fmt, kind] = numpy_type(t.dtype, name);
  const py::dtype dt(fmt);
  std::vector<py::ssize_t> shape(size_t(t.ndim)), strides(size_t(t.ndim));
  py::ssize_t step = dt.itemsize();
  for (int i = t.ndim - 1; i >= 0; --i) {
    shape[size_t(i)] = t.shape[i], strides[size_t(i)] = step;
    if (t.strides && t.shape[i] > 1 && t.strides[i] * dt.itemsize() != step) {
      std::string s;
      for (int j = 0; j < t.ndim; ++j) s += (j ? ", " : "") + std::to_string(t.strides[j]);
      throw ValueError(msg(name, " is not C-contiguous (strides (", s, ") elements); make it contiguous first "
                           "(e.g. .contiguous()): moe_cpu makes no silent copy"));
    }
    step *= t.shape[i];
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  // Take ownership only now that nothing can fail: the renamed capsule no longer frees the tensor.
  PyCapsule_SetName(c, versioned ? "used_dltensor_versioned" : "used_dltensor");
  py::capsule owner(new Owner{mt, versioned}, [](void* p) { delete static_cast<Owner*>(p); });
  py::array arr(dt, shape, strides, data, owner);
  if (readonly) arr.attr("setflags")(py::arg("write") = false);
  return py::make_tuple(arr, kind);
}

}  // namespace

void bind_dlpack(py::module_& m) {
  m.def("from_dlpack", &from_dlpack, py::arg("obj"), py::arg("name"),
        "(NumPy array sharing obj's memory, kind) for a CPU DLPack producer; kind is 'bfloat16' or "
        "'float8_e4m3fn' when the array holds those as uint bits, else ''.");
}
