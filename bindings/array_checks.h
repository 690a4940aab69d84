// array_checks.h — argument checks for NumPy arrays: exact dtype, C-contiguity and shape, never a
// conversion. Failures throw moe_cpu::TypeError (dtype / not an array) or ValueError (shape, layout).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "moe_cpu/errors.h"

namespace moe_cpu::py_checks {
namespace py = pybind11;

// Element types as (kind, itemsize): bf16 travels as raw uint16 bits.
enum class ElemType { kF32, kU16, kI32, kI64, kI8, kU8 };
inline const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::kF32: return "float32";
    case ElemType::kU16: return "bfloat16 (ml_dtypes.bfloat16 or uint16 bits)";
    case ElemType::kI32: return "int32";
    case ElemType::kI64: return "int64";
    case ElemType::kI8: return "int8";
    case ElemType::kU8: return "uint8";
  }
  return "?";
}
inline bool has_type(const py::array& a, ElemType t) {
  const char k = a.dtype().kind();
  const auto n = a.dtype().itemsize();
  switch (t) {
    case ElemType::kF32: return k == 'f' && n == 4;
    case ElemType::kU16: return k == 'u' && n == 2;
    case ElemType::kI32: return k == 'i' && n == 4;
    case ElemType::kI64: return k == 'i' && n == 8;
    case ElemType::kI8: return k == 'i' && n == 1;
    case ElemType::kU8: return k == 'u' && n == 1;
  }
  return false;
}

inline std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// `h` must be an ndarray of one of `types`, C-contiguous, with `ndim` dims.
inline py::array array_arg(py::handle h, const char* name, std::initializer_list<ElemType> types, int ndim) {
  if (!py::isinstance<py::array>(h))
    throw TypeError(msg(name, " must be a numpy.ndarray, got ", std::string(py::str(py::type::of(h).attr("__name__")))));
  auto a = py::reinterpret_borrow<py::array>(h);
  bool ok = false;
  std::string want;
  for (ElemType t : types) {
    ok = ok || has_type(a, t);
    want += (want.empty() ? "" : " or ") + std::string(elem_name(t));
  }
  if (!ok)
    throw TypeError(msg(name, " must have dtype ", want, ", got ", std::string(py::str(a.dtype())),
                        " (no implicit conversion is done)"));
  if (a.ndim() != ndim)
    throw ValueError(msg(name, " must be ", ndim, "-D, got shape ", shape_str(a)));
  if (!(a.flags() & py::array::c_style))
    throw ValueError(msg(name, " must be C-contiguous (use numpy.ascontiguousarray; no silent copy is made)"));
  return a;
}

// Shape check; -1 in `dims` matches anything. `expect` names the dims, e.g. "[M, H]".
inline void require_shape(const py::array& a, const char* name, std::vector<int64_t> dims, const char* expect) {
  bool ok = a.ndim() == py::ssize_t(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = dims[i] < 0 || a.shape(py::ssize_t(i)) == dims[i];
  if (ok) return;
  std::string want = "(";
  for (size_t i = 0; i < dims.size(); ++i) want += (i ? ", " : "") + (dims[i] < 0 ? std::string("*") : std::to_string(dims[i]));
  throw ValueError(msg(name, " has shape ", shape_str(a), " but ", expect, " = ", want, ")", " was expected"));
}

inline bool is_none(py::handle h) { return h.is_none(); }

// The output must not share bytes with an input the call still reads while it writes (a shifted view
// would read rows it has already overwritten): only the very same array is allowed, where `same_ok`.
inline void require_no_overlap(const py::array& out, const py::array& in, const char* name, bool same_ok) {
  const py::ssize_t on = out.nbytes(), in_n = in.nbytes();
  if (on == 0 || in_n == 0) return;
  const char *o = static_cast<const char*>(out.data()), *i = static_cast<const char*>(in.data());
  if (o >= i + in_n || i >= o + on) return;
  if (same_ok && o == i && on == in_n) return;
  throw ValueError(msg("out shares memory with ", name, same_ok ? " without being that same array" : "",
                       "; pass a separate output", same_ok ? std::string(" (or ") + name + " itself)" : std::string()));
}

}  // namespace moe_cpu::py_checks
