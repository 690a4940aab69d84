// pack.cpp — packing pre-quantized arrays (what a checkpoint holds) into the blocked layout of
// common/layout.h, with their checks; the kernel is chosen here and the integer forms derived for it.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "common/layout.h"
#include "common/parallel.h"
#include "dispatch/registry.h"
#include "moe/int_forms.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/packed_experts.h"

namespace moe_cpu {

namespace {

void check_dims(int64_t E, int64_t N, int64_t K) {
  if (E < 1 || N < 1 || K < 1)
    throw ValueError(msg("weight shape [E,N,K] = [", E, ",", N, ",", K, "] must have E, N, K >= 1"));
}

// The group length along K for int schemes: g > 0, a multiple of `mult`, dividing K; or -1.
void check_group(int64_t g, int64_t K, int64_t mult) {
  if (g == -1) return;
  if (g <= 0 || g % mult != 0)
    throw ValueError(msg("group_size = ", g, " must be ", mult > 1 ? msg("a positive multiple of ", mult) : "positive",
                         " or -1 (per channel)"));
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
  p.qweight = AlignedBuffer(size_t(E * p.num_blocks() * layout::panel_bytes(s, K)));
  return p;
}

// Writes every panel from the codes src [E*N, K] (`elt` bytes each): a k-step of one row is the
// sizeof(W) consecutive source bytes, stored XOR `flip` (int8: q + 128 is q ^ 0x80 per byte) at
// panel + t * step_bytes + sizeof(W) * c. The last, partial k-step keeps its padding 0.
template <class W>
void fill_panels(PackedExperts& p, const void* src, int64_t elt, W flip) {
  const int64_t N = p.out_features, K = p.in_features, NB = p.num_blocks(), sb = layout::step_bytes(p.scheme);
  const int64_t row_bytes = K * elt, full = row_bytes / int64_t(sizeof(W)), rest = row_bytes % int64_t(sizeof(W));
  parallel_for(p.num_experts * NB, [&](int64_t eb) {
    const int64_t e = eb / NB, b = eb % NB;
    uint8_t* panel = const_cast<uint8_t*>(p.panel(e, b));
    for (int64_t c = 0; c < 16 && 16 * b + c < N; ++c) {
      const uint8_t* row = static_cast<const uint8_t*>(src) + (e * N + 16 * b + c) * row_bytes;
      W w;
      for (int64_t t = 0; t < full; ++t) {
        std::memcpy(&w, row + t * int64_t(sizeof(W)), sizeof(W));
        w ^= flip;
        std::memcpy(panel + t * sb + int64_t(sizeof(W)) * c, &w, sizeof(W));
      }
      if (rest) {
        w = 0;
        std::memcpy(&w, row + full * int64_t(sizeof(W)), size_t(rest));
        w ^= flip;
        std::memcpy(panel + full * sb + int64_t(sizeof(W)) * c, &w, size_t(rest));
      }
    }
  });
}

// int4 panels straight from the codes q [E*N, K]: stored nibble u = q + 8 (zp: q itself). A whole
// k-step is one 8-byte load, a bytewise add (SWAR, no carries between bytes) and one 4-byte store
// of (u[i] | u[i + 4] << 4). Returns false if some u is outside [0, 15].
bool fill_int4_panels(PackedExperts& p, const int8_t* q, bool zp) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the SWAR packing assumes little endian");
  const int64_t N = p.out_features, K = p.in_features, NB = p.num_blocks(), full = K / 8;
  std::atomic<bool> bad{false};
  parallel_for(p.num_experts * NB, [&](int64_t eb) {
    const int64_t e = eb / NB, b = eb % NB;
    uint8_t* panel = const_cast<uint8_t*>(p.panel(e, b));
    uint64_t high = 0;  // OR of the high nibbles of every u: nonzero = out of range
    for (int64_t c = 0; c < 16 && 16 * b + c < N; ++c) {
      const int8_t* src = q + (e * N + 16 * b + c) * K;
      for (int64_t t = 0; t < full; ++t) {
        uint64_t x;
        std::memcpy(&x, src + 8 * t, 8);
        const uint64_t u = zp ? x : ((x & 0x7f7f7f7f7f7f7f7full) + 0x0808080808080808ull) ^ (x & 0x8080808080808080ull);
        high |= u;
        const uint32_t word = uint32_t(u) | (uint32_t(u >> 32) << 4);
        std::memcpy(panel + t * 64 + 4 * c, &word, 4);
      }
      for (int64_t k = 8 * full; k < K; ++k) {  // the last, partial k-step (the rest stays 0)
        const unsigned u = zp ? unsigned(uint8_t(src[k])) : unsigned(uint8_t(src[k] + 8));
        high |= u;
        const int64_t i = k - 8 * full;
        panel[full * 64 + 4 * c + i % 4] |= uint8_t((u & 15u) << (i < 4 ? 0 : 4));
      }
    }
    if (high & 0xf0f0f0f0f0f0f0f0ull) bad.store(true, std::memory_order_relaxed);
  });
  return !bad;
}

// First flat index i with bad(i), or -1. Rows are checked in parallel: row_ok(r) is a fast,
// vectorizable pass; only a row it rejects is searched element by element.
template <class RowOk, class Bad>
int64_t find_first(int64_t rows, int64_t len, RowOk row_ok, Bad bad) {
  std::vector<int64_t> first(static_cast<size_t>(rows), -1);
  parallel_for(rows, [&](int64_t r) {
    if (row_ok(r)) return;
    for (int64_t i = r * len; i < (r + 1) * len; ++i)
      if (bad(i)) {
        first[size_t(r)] = i;
        return;
      }
  });
  for (int64_t f : first)
    if (f >= 0) return f;
  return -1;
}

// First flat index whose value lies outside [lo, hi], or -1.
template <class T>
int64_t find_outside(const T* v, int64_t rows, int64_t len, int lo, int hi) {
  return find_first(rows, len, [&](int64_t r) {
    int mn = hi, mx = lo;
    for (const T* x = v + r * len; x < v + (r + 1) * len; ++x) mn = std::min(mn, int(*x)), mx = std::max(mx, int(*x));
    return mn >= lo && mx <= hi;
  }, [&](int64_t i) { return int(v[i]) < lo || int(v[i]) > hi; });
}

// First flat index where (v & mask) == mask (e4m3fn NaN: 0x7f; bf16 inf/NaN: 0x7f80), or -1.
template <class T>
int64_t find_all_bits(const T* v, int64_t rows, int64_t len, int mask) {
  return find_first(rows, len, [&](int64_t r) {
    int mx = 0;
    for (const T* x = v + r * len; x < v + (r + 1) * len; ++x) mx = std::max(mx, int(*x) & mask);
    return mx != mask;
  }, [&](int64_t i) { return (int(v[i]) & mask) == mask; });
}

// Optional float group offsets: checked finite, stored in the scales' blocked order.
void set_mins(PackedExperts& p, const float* mins) {
  if (!mins) return;
  const int64_t N = p.out_features, G = p.num_groups();
  check_scales(mins, p.num_experts * N * G, "mins");
  p.has_mins = true;
  p.mins = blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return mins[(e * N + n) * G + gi]; });
}

}  // namespace

PackedExperts pack_int4(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const uint8_t* zeros, const int8_t* codebook, const float* mins, bool a16) {
  check_dims(E, N, K);
  check_group(group_size, K, a16 ? 32 : 16);  // W4A8: groups of 16 (GGUF's IQ2_XS, IQ2_S, IQ1_M, ik's IQ2_K, IQ3_K)
  if (zeros && codebook)
    throw ValueError("int4 weights take zero points or a codebook, not both");
  PackedExperts p = make(Scheme::kInt4W4A8, E, N, K, group_size);
  const int64_t G = p.num_groups();
  const bool zp = zeros != nullptr, raw = zp || codebook;  // q holds the stored codes u themselves
  check_scales(scales, E * N * G, "scales");
  if (zp)
    for (int64_t i = 0; i < E * N * G; ++i)
      if (zeros[i] > 15) throw ValueError(msg("zeros flat index ", i, " = ", int(zeros[i]), " is outside [0, 15]"));
  p.has_zeros = zp;
  if (zp) {
    const int8_t identity[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    p.set_codebook(identity);
  }
  if (codebook) p.set_codebook(codebook), p.has_codebook = true;
  p.scales = blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return scales[(e * N + n) * G + gi]; });
  if (zp) p.zeros = blocked<uint8_t>(p, [&](int64_t e, int64_t n, int64_t gi) { return zeros[(e * N + n) * G + gi]; });
  set_mins(p, mins);
  // One pass: the stored nibble u is q + 8 (or q itself with zero points / a codebook) and must be in
  // [0, 15]; a value outside flags the pack, and only then is the input scanned for the first bad index.
  const bool out_of_range = !fill_int4_panels(p, q, raw);
  if (out_of_range) {
    const int64_t bad = raw ? find_outside(reinterpret_cast<const uint8_t*>(q), E * N, K, 0, 15)
                            : find_outside(q, E * N, K, -8, 7);
    throw ValueError(msg("qweight flat index ", bad, " = ", raw ? int(uint8_t(q[bad])) : int(q[bad]), " is outside ",
                         zp ? "[0, 15] (unsigned int4 with zero points)"
                            : raw ? "[0, 15] (4-bit codebook indices)" : "[-8, 7] (signed int4)"));
  }
  p.a16 = a16;
  set_kernel(p, select_kernel(p));  // and the scale / min forms it reads
  return p;
}

PackedExperts pack_int8(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const float* mins, bool a16) {
  check_dims(E, N, K);
  check_group(group_size, K, 1);
  PackedExperts p = make(Scheme::kInt8W8A8, E, N, K, group_size);
  const int64_t G = p.num_groups();
  check_scales(scales, E * N * G, "scales");
  p.scales = blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return scales[(e * N + n) * G + gi]; });
  set_mins(p, mins);
  fill_panels<uint32_t>(p, q, 1, 0x80808080u);
  p.a16 = a16;
  set_kernel(p, select_kernel(p));  // and the scale / min forms it reads
  return p;
}

PackedExperts pack_fp8(const uint8_t* codes, int64_t E, int64_t N, int64_t K, const float* scale_inv,
                       int64_t block_n, int64_t block_k) {
  check_dims(E, N, K);
  if (block_n < 1 || block_k < 1)
    throw ValueError(msg("block_size = (", block_n, ", ", block_k, ") must be two positive integers"));
  PackedExperts p = make(Scheme::kFp8W8A16, E, N, K, block_k);
  p.block_n = block_n;
  const int64_t nan_at = find_all_bits(codes, E * N, K, 0x7f);  // 0x7f and 0xff are NaN
  if (nan_at >= 0)
    throw ValueError(msg("weight flat index ", nan_at, " is an e4m3fn NaN code (0x", std::hex, int(codes[nan_at]),
                         "); fp8 weights must be finite"));
  const int64_t ns = E * ceil_div(N, block_n) * p.num_groups();
  check_scales(scale_inv, ns, "scale_inv");
  const int64_t nbn = ceil_div(N, block_n), kb = p.num_groups();
  p.scales = blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) {
    return scale_inv[(e * nbn + n / block_n) * kb + gi];
  });
  fill_panels<uint16_t>(p, codes, 1, 0);
  p.kernel = select_kernel(p);
  return p;
}

PackedExperts pack_bf16(const uint16_t* bits, int64_t E, int64_t N, int64_t K) {
  check_dims(E, N, K);
  PackedExperts p = make(Scheme::kBf16, E, N, K, -1);
  const int64_t bad = find_all_bits(bits, E * N, K, 0x7f80);  // inf / NaN: every exponent bit set
  if (bad >= 0)
    throw ValueError(msg("weight flat index ", bad, " is not finite (bf16 bits 0x", std::hex, bits[bad],
                         "); weights must be finite"));
  fill_panels<uint32_t>(p, bits, 2, 0u);
  p.kernel = select_kernel(p);
  return p;
}

}  // namespace moe_cpu
