// bind_pack.cpp — PackedExperts and the pack / quantize / unpack functions.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "array_checks.h"
#include "common/numeric.h"
#include "dispatch/registry.h"
#include "moe_cpu/packed_experts.h"

namespace py = pybind11;
using namespace moe_cpu;
using namespace moe_cpu::py_checks;

namespace {

using Ptr = std::shared_ptr<PackedExperts>;
Ptr share(PackedExperts&& p) { return std::make_shared<PackedExperts>(std::move(p)); }

// float32 scales, or bf16 bits widened exactly to float32.
std::vector<float> scales_f32(const py::array& s) {
  std::vector<float> out(static_cast<size_t>(s.size()));
  if (has_type(s, ElemType::kF32)) {
    std::memcpy(out.data(), s.data(), out.size() * 4);
  } else {
    const auto* b = static_cast<const uint16_t*>(s.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(b[i]);
  }
  return out;
}

// Scales of an int scheme: [E,N,G] (or [E,N] per channel when allow_2d); returns G-derived group.
py::array int_scales(py::handle h, int64_t E, int64_t N, int64_t K, int64_t group, bool allow_2d,
                     const char* name = "scales") {
  if (!py::isinstance<py::array>(h)) array_arg(h, name, {ElemType::kF32}, 3);
  auto raw = py::reinterpret_borrow<py::array>(h);
  const int nd = (allow_2d && raw.ndim() == 2) ? 2 : 3;
  auto s = array_arg(h, name, {ElemType::kF32, ElemType::kU16}, nd);
  const int64_t G = group == -1 ? 1 : (group > 0 && K % group == 0 ? K / group : -1);
  if (G < 0) return s;  // the group check in the core reports it
  if (nd == 2) {
    if (group != -1) throw ValueError(msg(name, " is 2-D [E, N], which means per channel, but group_size = ", group));
    require_shape(s, name, {E, N}, "[E, N]");
  } else {
    require_shape(s, name, {E, N, G}, group == -1 ? "[E, N, 1] (per channel)" : "[E, N, K // group_size]");
  }
  return s;
}

// The stored codes in [E, N, K] order: int4 q in [-8,7] (raw u in [0,15] with zero points),
// int8 q, fp8 codes, bf16 bits; channels in the activations' order (k_perm undone).
py::array codes_array(const PackedExperts& p) {
  const int64_t E = p.num_experts, N = p.out_features, K = p.in_features;
  const bool raw = p.scheme == Scheme::kFp8W8A16 || p.has_zeros || p.has_codebook;
  const char* dt = p.scheme == Scheme::kBf16 ? "uint16" : raw ? "uint8" : "int8";
  py::array out(py::dtype(dt), {E, N, K});
  const auto isz = out.itemsize();
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  std::vector<uint16_t> u(static_cast<size_t>(K));
  for (int64_t r = 0; r < E * N; ++r) {
    p.code_row(r / N, r % N, u.data());
    const bool shift = is_int_scheme(p.scheme) && !raw;  // signed q = u - implicit zero
    const int32_t* perm = p.has_k_perm() ? p.perm_row(r / N) : nullptr;
    for (int64_t j = 0; j < K; ++j) {
      const int v = shift ? int(u[size_t(j)]) - p.zero(r / N, r % N, 0) : int(u[size_t(j)]);
      const int64_t k = perm ? perm[j] : j;
      if (isz == 2) reinterpret_cast<uint16_t*>(dst)[r * K + k] = uint16_t(v);
      else dst[r * K + k] = uint8_t(v);
    }
  }
  return out;
}

// Scales (or mins) back in checkpoint order: [E, N, G] (int), [E, ceil(N/bn), KB] (fp8).
py::array scales_array(const PackedExperts& p, bool mins = false) {
  const bool fp8 = p.scheme == Scheme::kFp8W8A16;
  const int64_t E = p.num_experts, G = p.num_groups(), step = fp8 ? p.block_n : 1;
  const int64_t rows = ceil_div(p.out_features, step);
  py::array_t<float> s({E, rows, G});
  float* d = s.mutable_data();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t gi = 0; gi < G; ++gi) d[(e * rows + r) * G + gi] = mins ? p.min(e, r * step, gi) : p.scale(e, r * step, gi);
  return s;
}

// Act-order: the group of each input channel, g_idx[e, k_perm[e][j]] = j / group length; else None.
py::object g_idx_of(const PackedExperts& p) {
  if (!p.has_k_perm()) return py::none();
  const int64_t E = p.num_experts, K = p.in_features, gl = p.group_len();
  py::array_t<int32_t> g({E, K});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < K; ++j) g.mutable_data()[e * K + p.perm_row(e)[j]] = int32_t(j / gl);
  return std::move(g);
}

// Freshly packed weights, shared: k_perm [E, K] int32 (empty: none) and the A8 activation block (0: per token) set.
Ptr finish_packing(PackedExperts&& p, const std::vector<int32_t>& kp, int64_t act_block = 0) {
  if (!kp.empty()) set_k_perm(p, kp.data());
  if (act_block) set_act_block(p, act_block);
  return share(std::move(p));
}
std::vector<int32_t> k_perm_arg(py::handle h, int64_t E, int64_t K) {
  if (h.is_none()) return {};
  auto kp = array_arg(h, "k_perm", {ElemType::kI32}, 2);
  require_shape(kp, "k_perm", {E, K}, "[E, K]");
  const auto* d = static_cast<const int32_t*>(kp.data());
  return std::vector<int32_t>(d, d + E * K);
}

// pack_int4 / pack_int8's scheme: the A8 or the A16 name of `weights`; true for A16.
bool a16_arg(const std::string& scheme, Scheme weights, const char* fn) {
  const Scheme s = parse_scheme(scheme);
  if (weight_scheme(s) != weights)
    throw ValueError(msg(fn, " packs ", weights == Scheme::kInt4W4A8 ? "int4" : "int8", " weights: scheme = '", scheme,
                         "' must be '", scheme_name(weights), "' or '", scheme_name(run_scheme(weights, true)), "'"));
  return is_a16_scheme(s);
}

py::object codebook_of(const PackedExperts& p) {
  if (!p.has_codebook) return py::none();
  return py::array_t<int8_t>(16, p.codebook);
}

py::dict unpack_quantized(const PackedExperts& p) {
  py::dict d;
  const int64_t E = p.num_experts, N = p.out_features, G = p.num_groups();
  switch (p.scheme) {
    case Scheme::kInt4W4A8:
    case Scheme::kInt8W8A8:
      d["qweight"] = codes_array(p);
      d["scales"] = scales_array(p);
      d["mins"] = p.has_mins ? py::object(scales_array(p, true)) : py::object(py::none());
      d["g_idx"] = g_idx_of(p);
      if (p.scheme == Scheme::kInt4W4A8) d["codebook"] = codebook_of(p);
      if (p.scheme == Scheme::kInt4W4A8) {
        if (p.has_zeros) {
          py::array_t<uint8_t> z({E, N, G});
          for (int64_t r = 0; r < E * N; ++r)
            for (int64_t gi = 0; gi < G; ++gi) z.mutable_data()[r * G + gi] = uint8_t(p.zero(r / N, r % N, gi));
          d["zeros"] = z;
        } else {
          d["zeros"] = py::none();
        }
      }
      break;
    case Scheme::kFp8W8A16:
      d["weight"] = codes_array(p);
      d["scale_inv"] = scales_array(p);
      break;
    case Scheme::kBf16:
      d["weight"] = codes_array(p);
      break;
  }
  return d;
}

}  // namespace

void bind_pack(py::module_& m) {
  py::class_<PackedExperts, Ptr>(m, "PackedExperts",
                                 "Expert weights [E, N, K] of one projection, packed in one scheme for one kernel.")
      .def_property_readonly("scheme", [](const PackedExperts& p) { return scheme_name(p.run_scheme()); },
                             "Scheme name: int4_w4a8, int8_w8a8, int4_w4a16, int8_w8a16 (int weights with 16-bit "
                             "activations), fp8_w8a16 or bf16.")
      .def_property_readonly("num_experts", [](const PackedExperts& p) { return p.num_experts; }, "E, the number of experts.")
      .def_property_readonly("out_features", [](const PackedExperts& p) { return p.out_features; }, "N, output features per expert (rows of each weight matrix).")
      .def_property_readonly("in_features", [](const PackedExperts& p) { return p.in_features; }, "K, input features per expert (the GEMM reduction length).")
      .def_property_readonly("group_size", [](const PackedExperts& p) { return p.group_size; }, "int4/int8: scale group length along K, or -1 per channel; fp8: block_k; bf16: -1.")
      .def_property_readonly("block_size", [](const PackedExperts& p) -> py::object {
        if (p.scheme != Scheme::kFp8W8A16) return py::none();
        return py::make_tuple(p.block_n, p.group_size);
      }, "fp8: (block_n, block_k); None for other schemes.")
      .def_property_readonly("has_zeros", [](const PackedExperts& p) { return p.has_zeros; }, "True when int4 weights carry zero points.")
      .def_property_readonly("has_mins", [](const PackedExperts& p) { return p.has_mins; }, "True when int weights carry float group offsets (w = s * q - m).")
      .def_property_readonly("has_int_mins", [](const PackedExperts& p) { return p.imin_groups > 0; },
                             "True when the kernel holds the mins as dmin * int8 per run of 8 groups (K-quant mins; x86 int4 "
                             "kernels, int8 on AVX-512 VNNI and AMX): exact, summed in int32 per run. unpack() gives the same floats.")
      .def_property_readonly("has_half_scales", [](const PackedExperts& p) { return p.half_scales; },
                             "True when the kernel holds the scales as fp16 (every scale exactly an fp16 value, as GGUF's Q4_0 / Q8_0 "
                             "d; the x86 int kernels but AMX's): exact, 2 bytes per group and column instead of 4. unpack() gives the same floats.")
      .def_property_readonly("has_int_scales", [](const PackedExperts& p) { return p.iscale_groups > 0; },
                             "True when the kernel holds the group scales as d * int8 per run of 8 groups (K-quant and "
                             "IQ4_XS scales; the x86 int kernels, AMX int4): exact, 1.5 bytes per group and column instead of 4. "
                             "unpack() gives the same floats.")
      .def_property_readonly("has_int_nibbles", [](const PackedExperts& p) { return p.int_nibbles; },
                             "True when the kernel holds both integer forms in 4 bits (GGUF Q2_K's scales and mins on the "
                             "AVX2 tier): two groups a byte, one fp16 d and dmin per 256, as the file. unpack() gives the same floats.")
      .def_property_readonly("code_bits", [](const PackedExperts& p) {
        return p.split_bits ? p.split_bits : p.scheme == Scheme::kInt4W4A8 ? 4 : p.scheme == Scheme::kBf16 ? 16 : 8;
      },
                             "Bits a weight code takes in memory: 4 (int4), 8 (int8, fp8), 16 (bf16), or 2 / 3 / 4 / 5 / 6 "
                             "when the kernel holds int8 codes that span at most 4 / 8 / 16 / 32 / 64 values (GGUF Q2_K / Q3_K / Q5_K / "
                             "Q6_K) as split codes (low bits + high bits; the AVX2 vpmaddubsw and AVX-512 VNNI kernels, 3 bits on "
                             "AVX-512 only): exact. unpack() and files give the same int8 values.")
      .def_property_readonly("act_block", [](const PackedExperts& p) -> py::object {
        if (!p.act_block) return py::none();
        return py::int_(p.act_block);
      }, "A8 int weights: the activation block B (one int8 scale per B channels of each token), or None for one "
         "scale per token (and for A16 / fp8 / bf16 weights). See docs/numerics.md.")
      .def_property_readonly("codebook", &codebook_of, "int4 with a codebook: int8 [16], the value of each 4-bit code; else None.")
      .def_property_readonly("form", [](const PackedExperts& p) { return p.form(); },
                             "The weight form: int4, int4+zeros, int4+codebook, int4+mins, int4+codebook+mins, "
                             "int8, int8+mins, fp8 or bf16.")
      .def_property_readonly("nbytes", [](const PackedExperts& p) { return p.nbytes(); }, "Bytes of packed weights, scales and zero points.")
      .def_property_readonly("kernel", [](const PackedExperts& p) { return std::string(p.kernel->name); }, "Name of the kernel the weights were packed for, e.g. w4a8_reference.")
      .def("unpack", [](const PackedExperts& p) {
        py::array_t<float> out({p.num_experts, p.out_features, p.in_features});
        float* dst = out.mutable_data();
        py::gil_scoped_release nogil;
        unpack(p, dst);
        return out;
      }, "Dequantized float32 weights [E, N, K].")
      .def("unpack_quantized", &unpack_quantized,
           "The stored codes and scales as arrays: int4 {qweight, scales, zeros, codebook, mins, g_idx}, int8 "
           "{qweight, scales, mins, g_idx}, fp8 {weight, scale_inv}, bf16 {weight}. With a codebook (or zeros) qweight holds the "
           "uint8 codes; unused entries are None.")
      .def("save", [](const PackedExperts& p, py::object path_like) {
        const std::string path = py::module_::import("os").attr("fspath")(path_like).cast<std::string>();
        py::gil_scoped_release nogil;
        save_packed(p, path);
      }, py::arg("path"),
           "Write the packed weights to a versioned, checksummed file (see docs/formats.md); "
           "moe_cpu.load_packed maps it back without a copy.")
      .def("__repr__", [](const PackedExperts& p) {
        return msg("PackedExperts(scheme=", scheme_name(p.run_scheme()), ", form=", p.form(), ", E=", p.num_experts, ", N=", p.out_features,
                   ", K=", p.in_features, ", group_size=", p.group_size,
                   is_int_scheme(p.scheme) && !p.a16 ? (p.act_block ? msg(", act_block=", p.act_block) : std::string(", act_block=None")) : std::string(),
                   ", kernel=", p.kernel->name,
                   ", nbytes=", p.nbytes(), ")");
      });

  m.def("pack_int4", [](py::handle q_h, py::handle s_h, int64_t group, py::handle z_h, py::handle cb_h, py::handle m_h,
                        py::handle kp_h, const std::string& scheme, int64_t act_block) {
    const bool a16 = a16_arg(scheme, Scheme::kInt4W4A8, "pack_int4");
    const bool zp = !z_h.is_none(), cb = !cb_h.is_none();
    auto q = array_arg(q_h, "qweight", {zp || cb ? ElemType::kU8 : ElemType::kI8}, 3);
    const int64_t E = q.shape(0), N = q.shape(1), K = q.shape(2);
    auto s = int_scales(s_h, E, N, K, group, false);
    std::vector<float> sf = scales_f32(s);
    py::array z, c;
    if (zp) {
      z = array_arg(z_h, "zeros", {ElemType::kU8, ElemType::kI8}, 3);
      require_shape(z, "zeros", {E, N, s.shape(2)}, "the scales shape [E, N, G]");
    }
    if (cb) {
      c = array_arg(cb_h, "codebook", {ElemType::kI8}, 1);
      require_shape(c, "codebook", {16}, "[16] (one int8 value per 4-bit code)");
    }
    std::vector<float> mf;
    if (!m_h.is_none()) mf = scales_f32(int_scales(m_h, E, N, K, group, false, "mins"));
    const std::vector<int32_t> kp = k_perm_arg(kp_h, E, K);
    py::gil_scoped_release nogil;
    return finish_packing(pack_int4(static_cast<const int8_t*>(q.data()), E, N, K, sf.data(), group,
                                 zp ? static_cast<const uint8_t*>(z.data()) : nullptr,
                                 cb ? static_cast<const int8_t*>(c.data()) : nullptr, mf.empty() ? nullptr : mf.data(), a16),
                       kp, act_block);
  }, py::arg("qweight"), py::arg("scales"), py::arg("group_size"), py::arg("zeros"), py::arg("codebook"),
     py::arg("mins"), py::arg("k_perm") = py::none(), py::arg("scheme") = "int4_w4a8", py::arg("act_block") = 0);

  m.def("pack_int8", [](py::handle q_h, py::handle s_h, int64_t group, py::handle m_h, py::handle kp_h, const std::string& scheme,
                        int64_t act_block) {
    const bool a16 = a16_arg(scheme, Scheme::kInt8W8A8, "pack_int8");
    auto q = array_arg(q_h, "qweight", {ElemType::kI8}, 3);
    const int64_t E = q.shape(0), N = q.shape(1), K = q.shape(2);
    auto s = int_scales(s_h, E, N, K, group, true);
    std::vector<float> sf = scales_f32(s);
    std::vector<float> mf;
    if (!m_h.is_none()) mf = scales_f32(int_scales(m_h, E, N, K, group, true, "mins"));
    const std::vector<int32_t> kp = k_perm_arg(kp_h, E, K);
    py::gil_scoped_release nogil;
    return finish_packing(pack_int8(static_cast<const int8_t*>(q.data()), E, N, K, sf.data(), group,
                                 mf.empty() ? nullptr : mf.data(), a16), kp, act_block);
  }, py::arg("qweight"), py::arg("scales"), py::arg("group_size"), py::arg("mins"), py::arg("k_perm") = py::none(),
     py::arg("scheme") = "int8_w8a8", py::arg("act_block") = 0);

  m.def("pack_fp8", [](py::handle w_h, py::handle s_h, int64_t bn, int64_t bk) {
    auto w = array_arg(w_h, "weight", {ElemType::kU8}, 3);
    const int64_t E = w.shape(0), N = w.shape(1), K = w.shape(2);
    auto s = array_arg(s_h, "scale_inv", {ElemType::kF32}, 3);
    if (bn < 1 || bk < 1)
      throw ValueError(msg("block_size = (", bn, ", ", bk, ") must be two positive integers"));
    require_shape(s, "scale_inv", {E, ceil_div(N, bn), ceil_div(K, bk)}, "[E, ceil(N/bn), ceil(K/bk)]");
    py::gil_scoped_release nogil;
    return share(pack_fp8(static_cast<const uint8_t*>(w.data()), E, N, K, static_cast<const float*>(s.data()), bn, bk));
  }, py::arg("weight"), py::arg("scale_inv"), py::arg("block_n"), py::arg("block_k"));

  m.def("pack_bf16", [](py::handle w_h) {
    auto w = array_arg(w_h, "weight", {ElemType::kU16}, 3);
    py::gil_scoped_release nogil;
    return share(pack_bf16(static_cast<const uint16_t*>(w.data()), w.shape(0), w.shape(1), w.shape(2)));
  }, py::arg("weight"));

  m.def("quantize_experts", [](py::handle w_h, const std::string& scheme, int64_t group, int64_t bn, int64_t bk, int64_t act_block) {
    auto w = array_arg(w_h, "w", {ElemType::kF32}, 3);
    const Scheme s = parse_scheme(scheme);
    py::gil_scoped_release nogil;
    return finish_packing(quantize_experts(static_cast<const float*>(w.data()), w.shape(0), w.shape(1), w.shape(2), s,
                                        group, bn, bk), {}, act_block);
  }, py::arg("w"), py::arg("scheme"), py::arg("group_size"), py::arg("block_n"), py::arg("block_k"), py::arg("act_block") = 0);

  m.def("load_packed", [](const std::string& path, bool use_mmap, bool verify) {
    py::gil_scoped_release nogil;
    return share(load_packed(path, use_mmap, verify));
  }, py::arg("path"), py::arg("mmap"), py::arg("verify"));

  m.def("registered_kernels", [] {
    py::list out;
    for (const KernelDesc* k : all_kernels())
      out.append(py::dict(py::arg("name") = k->name, py::arg("scheme") = scheme_name(k->scheme),
                          py::arg("isa") = k->isa, py::arg("mr") = k->mr, py::arg("nr") = k->nr));
    return out;
  });
  // The kernel dispatch would pick now for a typical layer (K = N = 4096, int4 g = 128, fp8 128x128).
  m.def("selected_kernel", [](const std::string& scheme) {
    PackedExperts p;
    const Scheme s = parse_scheme(scheme);
    p.scheme = weight_scheme(s), p.a16 = is_a16_scheme(s);
    p.num_experts = 1, p.out_features = 4096, p.in_features = 4096;
    p.group_size = p.scheme == Scheme::kInt4W4A8 || p.scheme == Scheme::kFp8W8A16 ? 128 : -1;
    p.block_n = 128;
    return std::string(select_kernel(p)->name);
  }, py::arg("scheme"));
}
