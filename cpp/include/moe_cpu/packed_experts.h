// packed_experts.h — expert weights of one projection in one scheme, packed for the kernel chosen
// at pack time. Canonical (reference) layout, per expert e, row n (output feature), column k:
//   int4_w4a8: qweight uint8 [E,N,ceil(K/2)], byte k/2 holds k even (low nibble) and k+1 (high);
//              nibble u in [0,15] is q+8 (symmetric) or raw (with zeros); scales f32 [E,N,G];
//              zeros uint8 [E,N,G] (only with zero points). Dequantized w = (u - z) * s, z = 8 if symmetric.
//   int8_w8a8: qweight int8 [E,N,K]; scales f32 [E,N,G].
//   fp8_w8a16: qweight uint8 e4m3fn codes [E,N,K]; scales f32 [E,ceil(N/bn),ceil(K/bk)] (multiply).
//   bf16:      qweight uint16 bf16 bits [E,N,K].
// G = K / group_len(): the number of scale groups along K.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "moe_cpu/types.h"

namespace moe_cpu {

struct KernelDesc;  // dispatch/registry.h

// 64-byte aligned, zero-initialised byte buffer.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  uint8_t* data() { return ptr_.get(); }
  const uint8_t* data() const { return ptr_.get(); }
  size_t size() const { return size_; }
  template <class T> T* as() { return reinterpret_cast<T*>(ptr_.get()); }
  template <class T> const T* as() const { return reinterpret_cast<const T*>(ptr_.get()); }

 private:
  struct Free { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, Free> ptr_;
  size_t size_ = 0;
};

struct PackedExperts {
  Scheme scheme = Scheme::kBf16;
  int64_t num_experts = 0, out_features = 0, in_features = 0;  // E, N, K
  int64_t group_size = -1;   // int4/int8: g, or -1 per channel; fp8: block_k; bf16: -1
  int64_t block_n = 0;       // fp8 only
  bool has_zeros = false;    // int4 only
  AlignedBuffer qweight, scales, zeros;
  const KernelDesc* kernel = nullptr;

  // Length along K of one scale group (K for per channel, block_k for fp8).
  int64_t group_len() const;
  int64_t num_groups() const;       // along K
  int64_t scale_rows() const;       // N for int schemes, ceil(N/bn) for fp8
  size_t nbytes() const { return qweight.size() + scales.size() + zeros.size(); }
  // Scale of (expert e, output row n, group gi).
  float scale(int64_t e, int64_t n, int64_t gi) const {
    int64_t r = scheme == Scheme::kFp8W8A16 ? n / block_n : n;
    return scales.as<float>()[(e * scale_rows() + r) * num_groups() + gi];
  }
  // Integer weight codes of row (e, n) minus zero points, for int schemes: out[K].
  void int_row(int64_t e, int64_t n, int8_t* out) const;
  // Dequantized float weights of row (e, n): out[K].
  void dequant_row(int64_t e, int64_t n, float* out) const;
};

// ---- packing from pre-quantized arrays (what a checkpoint holds). All throw ValueError. ----
// q: int8 in [-8,7] when zeros == nullptr, else values in [0,15] (uint8 bits) with zeros [E,N,G] in [0,15].
PackedExperts pack_int4(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const uint8_t* zeros);
PackedExperts pack_int8(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size);
PackedExperts pack_fp8(const uint8_t* codes, int64_t E, int64_t N, int64_t K, const float* scale_inv,
                       int64_t block_n, int64_t block_k);
PackedExperts pack_bf16(const uint16_t* bits, int64_t E, int64_t N, int64_t K);

// ---- quantization from float32 (DESIGN.md section 5). group_size: int4/int8 g or -1. ----
PackedExperts quantize_experts(const float* w, int64_t E, int64_t N, int64_t K, Scheme scheme,
                               int64_t group_size, int64_t block_n, int64_t block_k);

// Dequantized float32 [E,N,K].
void unpack(const PackedExperts& p, float* out);

}  // namespace moe_cpu
