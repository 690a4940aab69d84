// kernel_test_util.h — activation rows in the kernels' layout, and the kernel a test can run.
#pragma once
#include <string>
#include <vector>

#include "common/numeric.h"
#include "dispatch/registry.h"
#include "moe/int_forms.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu::test {
#if defined(__x86_64__)
extern const KernelDesc* const kEvexTwins[2];  // avx2vnni_evex_twins.cpp
#endif

// Activation rows in the layout the kernels read: stride Kp, zero padding, group sums, row_idx.
struct Acts {
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<int32_t> asum, idx;
  std::vector<uint16_t> b;
  std::vector<float> f;  // b as fp32 (kernels with f32_acts)
  mutable std::vector<float> asum_f32;  // asum as fp32, filled by view() for weights with mins
  mutable std::vector<int16_t> asum16;  // asum as int16 [R, G2], for weights with integer mins
  // A16 weights (p.a16): view() builds int16 rows from q times a16_mul (in a16_pos order) and their piece sums.
  int a16_mul = 1;
  mutable std::vector<int16_t> q16;
  mutable std::vector<int32_t> asum_pieces;
  void widen() {
    f.resize(b.size());
    for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_float(b[i]);
  }
  ActRows view(const PackedExperts& p, int64_t R) const {
    ActRows a;
    a.rows = R, a.Kp = p.padded_k(), a.row_idx = idx.data(), a.G = p.num_groups();
    if (!q.empty()) a.q = q.data(), a.scale = s.data(), a.asum = asum.data();
    if (!q.empty() && p.has_mins) {
      asum_f32.assign(asum.begin(), asum.end());
      if (p.a16)
        for (float& v : asum_f32) v *= float(a16_mul);
      a.asum_f32 = asum_f32.data();
    }
    if (!q.empty() && p.a16) {
      const int64_t Kp = a.Kp, K = p.in_features, G = a.G, gl = p.group_len(), NP = a16_pieces(gl);
      const int64_t rows = int64_t(q.size()) / Kp;
      q16.assign(q.size(), 0);
      asum_pieces.assign(size_t(rows * G * NP), 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < K; ++k) {
          const int16_t v = int16_t(q[size_t(r * Kp + k)] * a16_mul);
          q16[size_t(r * Kp + a16_pos(k))] = v;
          asum_pieces[size_t((r * G + k / gl) * NP + (k % gl) / kA16Piece)] += v;
        }
      a.q = nullptr, a.q16 = q16.data(), a.asum = asum_pieces.data(), a.NP = NP;
      return a;
    }
    if (!q.empty() && p.imin_groups) {
      const int64_t G = p.num_groups(), G2 = 2 * imin_pairs(p);
      asum16.assign(size_t(R * G2), 0);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t gi = 0; gi < G; ++gi) asum16[size_t(r * G2 + gi)] = int16_t(asum[size_t(r * G + gi)]);
      a.asum16 = asum16.data(), a.G2 = G2;
    }
    if (q.empty()) a.bf16 = b.data(), a.f32 = f.data();
    return a;
  }
};

// The kernel to run for `kd`: itself, or on a CPU with AVX512-VNNI but no AVX-VNNI, the EVEX twin of
// an AVX-VNNI kernel (same source, same semantics; see avx2vnni_evex_twins.cpp).
inline const KernelDesc* runnable(const KernelDesc* kd) {
#if defined(__x86_64__)
  if ((kd->features & active_features()) != kd->features)
    for (const KernelDesc* t : test::kEvexTwins)
      if (t->scheme == kd->scheme && std::string(t->isa) == kd->isa && (t->features & active_features()) == t->features)
        return t;
#endif
  return kd;
}

// The AVX-512 kernel an int AMX kernel (amx or amx_model) must match bit for bit, where it can run
// here (else nullptr).
inline const KernelDesc* amx_twin(const KernelDesc* kd) {
  const std::string isa = kd->isa;
  if ((isa != "amx" && isa != "amx_model") || !is_int_scheme(kd->scheme)) return nullptr;
  for (const KernelDesc* k : all_kernels())
    if (k->scheme == kd->scheme && std::string(k->isa) == "avx512vnni" && (k->features & active_features()) == k->features)
      return k;
  return nullptr;
}

// Every registered int kernel (int4 and int8), best first.
inline std::vector<const KernelDesc*> int_kernels() {
  std::vector<const KernelDesc*> out;
  for (const KernelDesc* k : all_kernels())
    if (is_int_scheme(k->scheme)) out.push_back(k);
  return out;
}

}  // namespace moe_cpu::test
