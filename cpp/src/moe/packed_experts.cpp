// packed_experts.cpp — the aligned buffers, a PackedExperts' rows (codes, integer values, dequantized) and
// unpacking; the packers are in pack.cpp, the integer forms of scales and mins in int_forms.cpp.
#include "moe_cpu/packed_experts.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include "common/layout.h"
#include "common/numeric.h"
#include "common/parallel.h"
#include "moe/split_codes.h"
#include "moe/qword_panels.h"
#include "moe_cpu/errors.h"

namespace moe_cpu {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  // Large buffers are their own 2 MiB-aligned anonymous mapping, asked to live on huge pages: the
  // kernel hands out zeroed pages (no second zeroing pass here), fewer page faults at pack time and
  // fewer TLB misses when a kernel streams a cold expert. Small ones: aligned_alloc + memset.
  constexpr size_t kHuge = size_t(2) << 20;
  if (bytes >= kHuge) {
    const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge, span = rounded + kHuge;
    void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    uint8_t* base = static_cast<uint8_t*>(m);
    uint8_t* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHuge - 1) / kHuge * kHuge);
    if (p > base) munmap(base, size_t(p - base));  // trim to the aligned span
    if (base + span > p + rounded) munmap(p + rounded, size_t(base + span - (p + rounded)));
#ifdef MADV_HUGEPAGE
    madvise(p, rounded, MADV_HUGEPAGE);
#endif
    ptr_ = std::unique_ptr<uint8_t, BufferFree>(p, BufferFree{rounded});
    return;
  }
  const size_t rounded = std::max<size_t>((bytes + 63) / 64 * 64, 64);
  uint8_t* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  ptr_.reset(p);
}
void BufferFree::operator()(uint8_t* p) const {
  if (mapped) munmap(p, mapped);
  else std::free(p);
}

AlignedBuffer AlignedBuffer::view(const uint8_t* p, size_t n, std::shared_ptr<const void> owner) {
  AlignedBuffer b;
  b.view_ = const_cast<uint8_t*>(p);  // kernels only read weights; a mapped file is read-only
  b.size_ = n;
  b.owner_ = std::move(owner);
  return b;
}

int64_t PackedExperts::padded_k() const { return layout::padded_k(scheme, in_features); }

int64_t PackedExperts::panel_bytes() const {
  return split_bits ? split_low_bytes(padded_k(), split_bits) : layout::panel_bytes(scheme, in_features);
}

int PackedExperts::zero(int64_t e, int64_t n, int64_t gi) const {
  if (has_zeros) return zeros.data()[scale_index(e, n, gi)];
  return scheme == Scheme::kInt4W4A8 ? code_zero : layout::implicit_zero(scheme);
}

void PackedExperts::set_codebook(const int8_t* cb) {
  int lo = 127;
  for (int i = 0; i < 16; ++i) codebook[i] = cb[i], lo = std::min(lo, int(cb[i]));
  code_zero = -lo;
  code_shuffle = false;
  for (int i = 0; i < 16; ++i) {
    code_table[i] = uint8_t(cb[i] - lo);
    code_shuffle |= code_table[i] != i;
  }
}

std::string PackedExperts::form() const {
  std::string f = scheme == Scheme::kInt4W4A8 ? "int4" : scheme == Scheme::kInt8W8A8 ? "int8"
                  : scheme == Scheme::kFp8W8A16 ? "fp8" : "bf16";
  if (has_zeros) f += "+zeros";
  if (has_codebook) f += "+codebook";
  if (has_mins) f += "+mins";
  if (has_k_perm()) f += "+act_order";
  return f;
}

void PackedExperts::code_row(int64_t e, int64_t n, uint16_t* out) const {
  if (split_bits) {  // the int8 byte w + 128 of each split code
    for (int64_t k = 0; k < in_features; ++k) out[k] = uint16_t(split_q(*this, e, n, k) - split_zero + 128);
    return;
  }
  const int64_t K = in_features, steps = padded_k() / layout::k_step(scheme), c = n % 16;
  const uint8_t* p = panel(e, n / 16);
  for (int64_t t = 0; t < steps; ++t) {
    const uint8_t* row = p + t * layout::step_bytes(scheme);
    switch (scheme) {
      case Scheme::kInt4W4A8:
        if (qword_panels) {
          for (int i = 0; i < 8; ++i) {
            bool high = false;
            const uint8_t b = row[qword_byte(c, i, &high)];
            if (8 * t + i < K) out[8 * t + i] = high ? b >> 4 : b & 0xf;
          }
          break;
        }
        for (int i = 0; i < 4; ++i) {
          if (8 * t + i < K) out[8 * t + i] = row[4 * c + i] & 0xf;
          if (8 * t + 4 + i < K) out[8 * t + 4 + i] = row[4 * c + i] >> 4;
        }
        break;
      case Scheme::kInt8W8A8:
        for (int i = 0; i < 4; ++i)
          if (4 * t + i < K) out[4 * t + i] = row[4 * c + i];
        break;
      case Scheme::kFp8W8A16:
        for (int i = 0; i < 2; ++i)
          if (2 * t + i < K) out[2 * t + i] = row[2 * c + i];
        break;
      case Scheme::kBf16:
        for (int i = 0; i < 2; ++i)
          if (2 * t + i < K) out[2 * t + i] = reinterpret_cast<const uint16_t*>(row)[2 * c + i];
        break;
      default: break;  // (the A16 names never reach PackedExperts::scheme)
    }
  }
}

void PackedExperts::int_row(int64_t e, int64_t n, int8_t* out) const {
  const int64_t K = in_features, gl = group_len();
  std::vector<uint16_t> u(static_cast<size_t>(K));
  code_row(e, n, u.data());
  if (scheme == Scheme::kInt4W4A8 && !has_zeros)
    for (int64_t k = 0; k < K; ++k) out[k] = codebook[u[size_t(k)]];
  else
    for (int64_t k = 0; k < K; ++k) out[k] = int8_t(int(u[size_t(k)]) - zero(e, n, k / gl));
}

void PackedExperts::dequant_row(int64_t e, int64_t n, float* out) const {
  const int64_t K = in_features, gl = group_len();
  if (is_int_scheme(scheme)) {
    std::vector<int8_t> q(static_cast<size_t>(K));
    int_row(e, n, q.data());
    for (int64_t k = 0; k < K; ++k) out[k] = float(q[size_t(k)]) * scale(e, n, k / gl);
    if (has_mins)  // a separate pass: s * q is rounded before m is subtracted (no contraction)
      for (int64_t k = 0; k < K; ++k) out[k] -= min(e, n, k / gl);
    return;
  }
  std::vector<uint16_t> u(static_cast<size_t>(K));
  code_row(e, n, u.data());
  for (int64_t k = 0; k < K; ++k)
    out[k] = scheme == Scheme::kBf16 ? bf16_to_float(u[size_t(k)])
                                     : e4m3fn_to_float(uint8_t(u[size_t(k)])) * scale(e, n, k / gl);
}

void unpack(const PackedExperts& p, float* out) {
  const int64_t rows = p.num_experts * p.out_features, K = p.in_features;
  parallel_for(rows, [&](int64_t r) {
    const int64_t e = r / p.out_features;
    if (!p.has_k_perm()) return p.dequant_row(e, r % p.out_features, out + r * K);
    thread_local std::vector<float> buf;
    buf.resize(size_t(K));
    float* row = buf.data();
    p.dequant_row(e, r % p.out_features, row);
    const int32_t* perm = p.perm_row(e);
    for (int64_t j = 0; j < K; ++j) out[r * K + perm[j]] = row[j];
  });
}

void set_k_perm(PackedExperts& p, const int32_t* perm) {
  if (!is_int_scheme(p.scheme))
    throw ValueError(msg("an input-channel permutation (act-order) needs an int scheme, not ", scheme_name(p.scheme)));
  if (p.act_block)
    throw ValueError(msg("act-order (g_idx) weights take per-token activations only, not act_block = ", p.act_block));
  const int64_t E = p.num_experts, K = p.in_features;
  std::vector<uint8_t> seen(static_cast<size_t>(K));
  for (int64_t e = 0; e < E; ++e) {
    std::fill(seen.begin(), seen.end(), uint8_t(0));
    for (int64_t j = 0; j < K; ++j) {
      const int32_t k = perm[e * K + j];
      if (k < 0 || k >= K || seen[size_t(k)]++)
        throw ValueError(msg("k_perm[", e, "] is not a permutation of [0, K = ", K, "): entry ", j, " = ", k,
                             k < 0 || k >= K ? " is out of range" : " repeats"));
    }
  }
  p.k_perm = AlignedBuffer(size_t(E * K) * sizeof(int32_t));
  std::memcpy(p.k_perm.data(), perm, size_t(E * K) * sizeof(int32_t));
}

}  // namespace moe_cpu
