// quantize.cpp — float32 -> packed experts by the rules of DESIGN.md section 5 (float32 arithmetic,
// rint = round half to even). An all-zero group or block gets scale 1.
#include <cmath>
#include <vector>

#include "common/numeric.h"
#include "common/parallel.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/packed_experts.h"

namespace moe_cpu {
namespace {

float amax_of(const float* w, int64_t n) {
  float a = 0.f;
  for (int64_t i = 0; i < n; ++i) a = std::fmax(a, std::fabs(w[i]));
  return a;
}

// Symmetric integer quantization of E*N rows in groups of gl: q = clamp(rint(w/s), lo, hi), s = amax/qmax.
void quantize_int(const float* w, int64_t rows, int64_t K, int64_t gl, float qmax, float lo, float hi,
                  int8_t* q, float* s) {
  const int64_t G = K / gl;
  parallel_for(rows, [&](int64_t r) {
    for (int64_t gi = 0; gi < G; ++gi) {
      const float* src = w + r * K + gi * gl;
      const float a = amax_of(src, gl);
      const float sc = a == 0.f ? 1.f : a / qmax;
      s[r * G + gi] = sc;
      for (int64_t k = 0; k < gl; ++k)
        q[r * K + gi * gl + k] = int8_t(std::fmin(hi, std::fmax(lo, std::nearbyint(src[k] / sc))));
    }
  });
}

}  // namespace

PackedExperts quantize_experts(const float* w, int64_t E, int64_t N, int64_t K, Scheme scheme,
                               int64_t group_size, int64_t block_n, int64_t block_k) {
  if (E < 1 || N < 1 || K < 1)
    throw ValueError(msg("w shape [E,N,K] = [", E, ",", N, ",", K, "] must have E, N, K >= 1"));
  std::vector<int64_t> bad(static_cast<size_t>(E * N), -1);
  parallel_for(E * N, [&](int64_t r) {
    for (int64_t i = r * K; i < (r + 1) * K && bad[size_t(r)] < 0; ++i)
      if (!std::isfinite(w[i])) bad[size_t(r)] = i;
  });
  for (int64_t i : bad)
    if (i >= 0) throw ValueError(msg("w flat index ", i, " = ", w[i], " is not finite; weights must be finite"));
  const int64_t rows = E * N;
  if (is_a16_scheme(scheme)) {  // the A8 twin's weights, run with 16-bit activations
    PackedExperts p = quantize_experts(w, E, N, K, weight_scheme(scheme), group_size, block_n, block_k);
    set_a16(p, true);
    return p;
  }
  switch (scheme) {
    case Scheme::kInt4W4A8:
    case Scheme::kInt8W8A8: {
      const bool int4 = scheme == Scheme::kInt4W4A8;
      if (group_size != -1 && (group_size <= 0 || K % group_size != 0 || (int4 && group_size % 32)))
        throw ValueError(msg("group_size = ", group_size, " must be -1 (per channel) or a positive ",
                             int4 ? "multiple of 32 " : "integer ", "dividing K = ", K));
      const int64_t gl = group_size > 0 ? group_size : K;
      std::vector<int8_t> q(static_cast<size_t>(rows * K));
      std::vector<float> s(static_cast<size_t>(rows * (K / gl)));
      if (int4) {
        quantize_int(w, rows, K, gl, 7.f, -8.f, 7.f, q.data(), s.data());
        return pack_int4(q.data(), E, N, K, s.data(), group_size, nullptr);
      }
      quantize_int(w, rows, K, gl, 127.f, -127.f, 127.f, q.data(), s.data());
      return pack_int8(q.data(), E, N, K, s.data(), group_size);
    }
    case Scheme::kFp8W8A16: {
      if (block_n < 1 || block_k < 1)
        throw ValueError(msg("block_size = (", block_n, ", ", block_k, ") must be two positive integers"));
      const int64_t nb = ceil_div(N, block_n), kb = ceil_div(K, block_k);
      std::vector<uint8_t> q(static_cast<size_t>(rows * K));
      std::vector<float> s(static_cast<size_t>(E * nb * kb));
      parallel_for(E * nb * kb, [&](int64_t b) {
        const int64_t e = b / (nb * kb), bn = (b / kb) % nb, bk = b % kb;
        const int64_t n0 = bn * block_n, n1 = std::min(N, n0 + block_n);
        const int64_t k0 = bk * block_k, k1 = std::min(K, k0 + block_k);
        float a = 0.f;
        for (int64_t n = n0; n < n1; ++n) a = std::fmax(a, amax_of(w + (e * N + n) * K + k0, k1 - k0));
        const float sc = a == 0.f ? 1.f : a / 448.f;
        s[size_t(b)] = sc;
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t i = (e * N + n) * K + k;
            q[size_t(i)] = float_to_e4m3fn(w[i] / sc);
          }
      });
      return pack_fp8(q.data(), E, N, K, s.data(), block_n, block_k);
    }
    case Scheme::kBf16: {
      std::vector<uint16_t> b(static_cast<size_t>(rows * K));
      parallel_for(rows, [&](int64_t r) {
        for (int64_t k = 0; k < K; ++k) b[size_t(r * K + k)] = float_to_bf16(w[r * K + k]);
      });
      return pack_bf16(b.data(), E, N, K);
    }
    default: break;
  }
  throw ValueError("unknown scheme");
}

}  // namespace moe_cpu
