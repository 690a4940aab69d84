// packed_experts.cpp — packing pre-quantized arrays into the canonical layout, and unpacking.
#include "moe_cpu/packed_experts.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/numeric.h"
#include "common/parallel.h"
#include "dispatch/registry.h"
#include "moe_cpu/errors.h"

namespace moe_cpu {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  uint8_t* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded ? rounded : 64));
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded ? rounded : 64);
  ptr_.reset(p);
}
void AlignedBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

int64_t PackedExperts::group_len() const {
  return group_size > 0 ? group_size : in_features;
}
int64_t PackedExperts::num_groups() const {
  const int64_t gl = group_len();
  return gl > 0 ? (in_features + gl - 1) / gl : 0;
}
int64_t PackedExperts::scale_rows() const {
  return scheme == Scheme::kFp8W8A16 ? (out_features + block_n - 1) / block_n : out_features;
}

void PackedExperts::int_row(int64_t e, int64_t n, int8_t* out) const {
  const int64_t K = in_features, row = e * out_features + n;
  if (scheme == Scheme::kInt8W8A8) {
    std::memcpy(out, qweight.as<int8_t>() + row * K, size_t(K));
    return;
  }
  const uint8_t* q = qweight.data() + row * ((K + 1) / 2);
  const int64_t gl = group_len(), G = num_groups();
  const uint8_t* z = has_zeros ? zeros.data() + row * G : nullptr;
  for (int64_t k = 0; k < K; ++k) {
    const int u = (k & 1) ? (q[k / 2] >> 4) : (q[k / 2] & 0xf);
    out[k] = int8_t(u - (z ? z[k / gl] : 8));
  }
}

void PackedExperts::dequant_row(int64_t e, int64_t n, float* out) const {
  const int64_t K = in_features, row = e * out_features + n, gl = group_len();
  switch (scheme) {
    case Scheme::kInt4W4A8:
    case Scheme::kInt8W8A8: {
      std::vector<int8_t> q(K);
      int_row(e, n, q.data());
      for (int64_t k = 0; k < K; ++k) out[k] = float(q[k]) * scale(e, n, k / gl);
      break;
    }
    case Scheme::kFp8W8A16: {
      const uint8_t* c = qweight.as<uint8_t>() + row * K;
      for (int64_t k = 0; k < K; ++k) out[k] = e4m3fn_to_float(c[k]) * scale(e, n, k / gl);
      break;
    }
    case Scheme::kBf16: {
      const uint16_t* b = qweight.as<uint16_t>() + row * K;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_float(b[k]);
      break;
    }
  }
}

void unpack(const PackedExperts& p, float* out) {
  const int64_t rows = p.num_experts * p.out_features, K = p.in_features;
  parallel_for(rows, [&](int64_t r) {
    p.dequant_row(r / p.out_features, r % p.out_features, out + r * K);
  });
}

namespace {

void check_dims(int64_t E, int64_t N, int64_t K) {
  if (E < 1 || N < 1 || K < 1)
    throw ValueError(msg("weight shape [E,N,K] = [", E, ",", N, ",", K, "] must have E, N, K >= 1"));
}

// The group length along K for int schemes: g > 0, multiple of 32, dividing K; or -1.
void check_group(int64_t g, int64_t K, bool need_mult32) {
  if (g == -1) return;
  if (g <= 0 || (need_mult32 && g % 32 != 0))
    throw ValueError(msg("group_size = ", g, need_mult32 ? " must be a positive multiple of 32 or -1 (per channel)"
                                                         : " must be positive or -1 (per channel)"));
  if (K % g != 0)
    throw ValueError(msg("group_size = ", g, " does not divide the input features K = ", K,
                         " (K must be a multiple of the group size)"));
}

void check_scales(const float* s, int64_t n, const char* name) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(s[i]))
      throw ValueError(msg(name, " has a non-finite value (", s[i], ") at flat index ", i,
                           "; scales must be finite"));
}

PackedExperts make(Scheme s, int64_t E, int64_t N, int64_t K, int64_t g) {
  PackedExperts p;
  p.scheme = s;
  p.num_experts = E, p.out_features = N, p.in_features = K, p.group_size = g;
  p.kernel = select_kernel(s);
  return p;
}

}  // namespace

PackedExperts pack_int4(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const uint8_t* zeros) {
  check_dims(E, N, K);
  check_group(group_size, K, true);
  PackedExperts p = make(Scheme::kInt4W4A8, E, N, K, group_size);
  const int64_t G = p.num_groups(), kb = (K + 1) / 2;
  const bool zp = zeros != nullptr;
  for (int64_t i = 0; i < E * N * K; ++i) {
    const int v = zp ? int(uint8_t(q[i])) : int(q[i]);
    if (zp ? (v > 15) : (v < -8 || v > 7))
      throw ValueError(msg("qweight flat index ", i, " = ", v, " is outside ",
                           zp ? "[0, 15] (unsigned int4 with zero points)" : "[-8, 7] (signed int4)"));
  }
  check_scales(scales, E * N * G, "scales");
  if (zp)
    for (int64_t i = 0; i < E * N * G; ++i)
      if (zeros[i] > 15) throw ValueError(msg("zeros flat index ", i, " = ", int(zeros[i]), " is outside [0, 15]"));
  p.has_zeros = zp;
  p.qweight = AlignedBuffer(size_t(E * N * kb));
  p.scales = AlignedBuffer(size_t(E * N * G) * 4);
  std::memcpy(p.scales.data(), scales, size_t(E * N * G) * 4);
  if (zp) {
    p.zeros = AlignedBuffer(size_t(E * N * G));
    std::memcpy(p.zeros.data(), zeros, size_t(E * N * G));
  }
  uint8_t* dst = p.qweight.data();
  parallel_for(E * N, [&](int64_t row) {
    const int8_t* src = q + row * K;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t u = zp ? uint8_t(src[k]) : uint8_t(src[k] + 8);
      dst[row * kb + k / 2] |= (k & 1) ? uint8_t(u << 4) : u;
    }
  });
  return p;
}

PackedExperts pack_int8(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size) {
  check_dims(E, N, K);
  check_group(group_size, K, false);
  PackedExperts p = make(Scheme::kInt8W8A8, E, N, K, group_size);
  const int64_t G = p.num_groups();
  check_scales(scales, E * N * G, "scales");
  p.qweight = AlignedBuffer(size_t(E * N * K));
  std::memcpy(p.qweight.data(), q, size_t(E * N * K));
  p.scales = AlignedBuffer(size_t(E * N * G) * 4);
  std::memcpy(p.scales.data(), scales, size_t(E * N * G) * 4);
  return p;
}

PackedExperts pack_fp8(const uint8_t* codes, int64_t E, int64_t N, int64_t K, const float* scale_inv,
                       int64_t block_n, int64_t block_k) {
  check_dims(E, N, K);
  if (block_n < 1 || block_k < 1)
    throw ValueError(msg("block_size = (", block_n, ", ", block_k, ") must be two positive integers"));
  PackedExperts p = make(Scheme::kFp8W8A16, E, N, K, block_k);
  p.block_n = block_n;
  for (int64_t i = 0; i < E * N * K; ++i)
    if (e4m3fn_is_nan(codes[i]))
      throw ValueError(msg("weight flat index ", i, " is an e4m3fn NaN code (0x", std::hex, int(codes[i]),
                           "); fp8 weights must be finite"));
  const int64_t ns = E * p.scale_rows() * p.num_groups();
  check_scales(scale_inv, ns, "scale_inv");
  p.qweight = AlignedBuffer(size_t(E * N * K));
  std::memcpy(p.qweight.data(), codes, size_t(E * N * K));
  p.scales = AlignedBuffer(size_t(ns) * 4);
  std::memcpy(p.scales.data(), scale_inv, size_t(ns) * 4);
  return p;
}

PackedExperts pack_bf16(const uint16_t* bits, int64_t E, int64_t N, int64_t K) {
  check_dims(E, N, K);
  PackedExperts p = make(Scheme::kBf16, E, N, K, -1);
  for (int64_t i = 0; i < E * N * K; ++i)
    if ((bits[i] & 0x7f80) == 0x7f80)
      throw ValueError(msg("weight flat index ", i, " is not finite (bf16 bits 0x", std::hex, bits[i],
                           "); weights must be finite"));
  p.qweight = AlignedBuffer(size_t(E * N * K) * 2);
  std::memcpy(p.qweight.data(), bits, size_t(E * N * K) * 2);
  return p;
}

}  // namespace moe_cpu
