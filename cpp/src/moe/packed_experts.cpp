// packed_experts.cpp — packing pre-quantized arrays into the canonical layout, and unpacking.
#include "moe_cpu/packed_experts.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include "common/layout.h"
#include "common/numeric.h"
#include "common/parallel.h"
#include "dispatch/registry.h"
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

int64_t PackedExperts::panel_bytes() const { return layout::panel_bytes(scheme, in_features); }

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
  const int64_t K = in_features, steps = padded_k() / layout::k_step(scheme), c = n % 16;
  const uint8_t* p = panel(e, n / 16);
  for (int64_t t = 0; t < steps; ++t) {
    const uint8_t* row = p + t * layout::step_bytes(scheme);
    switch (scheme) {
      case Scheme::kInt4W4A8:
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

// Scales (and zero points) into [E][NB][G][16] order; src(e, n, gi) gives the value. Written by the
// pool over (expert, column block) like the panels, so the pages are first-touched by the packing
// rank's threads (on its NUMA node) and not by the calling thread alone.
template <class T, class F>
AlignedBuffer blocked(const PackedExperts& p, F&& src) {
  const int64_t G = p.num_groups(), NB = p.num_blocks(), N = p.out_features;
  AlignedBuffer b(size_t(p.num_experts * NB * G * 16) * sizeof(T));
  T* d = b.as<T>();
  parallel_for(p.num_experts * NB, [&](int64_t eb) {
    const int64_t e = eb / NB, b16 = eb % NB;
    for (int64_t n = 16 * b16; n < std::min(N, 16 * b16 + 16); ++n)
      for (int64_t gi = 0; gi < G; ++gi) d[p.scale_index(e, n, gi)] = T(src(e, n, gi));
  });
  return b;
}

}  // namespace

// Optional float group offsets: checked finite, stored in the scales' blocked order.
static void set_mins(PackedExperts& p, const float* mins) {
  if (!mins) return;
  const int64_t N = p.out_features, G = p.num_groups();
  check_scales(mins, p.num_experts * N * G, "mins");
  p.has_mins = true;
  p.mins = blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return mins[(e * N + n) * G + gi]; });
}

// v[0..n) = float(m[j]) * d bit for bit (signed zeros too), m[j] an integer in [mlo, mhi], d one float:
// candidates d = a / (+-c) for the nonzero a of least magnitude and c = 1..cmax (K-quant mins and scales
// are d * a 6-bit integer, IQ4_XS's d * (6-bit - 32)). False if none.
template <class I>
static bool factor_run(const float* v, int n, int32_t mlo, int32_t mhi, int cmax, float* d, I* m) {
  float a = 0.f;
  for (int j = 0; j < n; ++j)
    if (v[j] != 0.f && (a == 0.f || std::fabs(v[j]) < std::fabs(a))) a = v[j];
  if (a == 0.f) {  // all zero (a zero d): d = +0, and m = -1 gives -0 (-1 * +0), m = 0 gives +0
    if (mlo > -1) return false;
    *d = 0.f;
    for (int j = 0; j < n; ++j) m[j] = std::signbit(v[j]) ? I(-1) : I(0);
    return true;
  }
  for (int c = 1; c <= cmax; ++c)
    for (int sign = 1; sign >= -1; sign -= 2) {
      const float dc = a / float(sign * c);
      if (dc == 0.f || !std::isfinite(dc)) return false;
      bool ok = true;
      for (int j = 0; j < n && ok; ++j) {
        const double t = std::nearbyint(double(v[j]) / double(dc));
        if (!(t >= mlo && t <= mhi)) {
          ok = false;
          break;
        }
        const float back = float(I(t)) * dc;  // what the kernels and unpack compute (an integer 0 is +0)
        ok = std::memcmp(&back, &v[j], 4) == 0;
        if (ok) m[j] = I(t);
      }
      if (ok) return (*d = dc), true;
    }
  return false;
}

// Factors every run of kIMinRun groups of every column of p: value(e, n, gi) = float(m) * d (factor_run
// with m in [mlo, mhi], cmax). Calls put(e, n, run, d, m, count) per run; false as soon as one does not factor.
template <class I, class Value, class Put>
static bool factor_runs(const PackedExperts& p, int32_t mlo, int32_t mhi, int cmax, Value value, Put put) {
  constexpr int64_t S = kIMinRun;
  const int64_t G = p.num_groups(), NB = p.num_blocks(), N = p.out_features, runs = (G + S - 1) / S;
  std::atomic<bool> ok{true};
  parallel_for(p.num_experts * NB, [&](int64_t eb) {
    const int64_t e = eb / NB, b16 = eb % NB;
    float v[S], d;
    I m[S];
    for (int64_t n = 16 * b16; n < std::min(N, 16 * b16 + 16) && ok.load(std::memory_order_relaxed); ++n)
      for (int64_t r = 0; r < runs; ++r) {
        const int cnt = int(std::min(S, G - r * S));
        for (int j = 0; j < cnt; ++j) v[j] = value(e, n, r * S + j);
        if (!factor_run(v, cnt, mlo, mhi, cmax, &d, m)) {
          ok = false;
          return;
        }
        put(e, n, r, d, m, cnt);
      }
  });
  return ok;
}

// An empty PackedExperts of p's scheme and shape (for its index arithmetic).
static PackedExperts shape_of(const PackedExperts& p) {
  PackedExperts t;
  t.scheme = p.scheme, t.num_experts = p.num_experts, t.out_features = p.out_features, t.in_features = p.in_features;
  t.group_size = p.group_size;
  return t;
}

void derive_int_mins(PackedExperts& p) {
  constexpr int64_t S = kIMinRun;
  const int64_t gl = p.group_len(), NB = p.num_blocks();
  if (!p.has_mins || !p.kernel || !p.kernel->int_mins || p.imin_groups || gl * 127 > 32767) return;
  // int16 code sums (|sum| <= 127 gl) and an int32 sum of S products per run
  const int32_t mmax = int32_t(std::min<int64_t>(32767, (int64_t(1) << 31) / (S * 127 * gl) - 1));
  PackedExperts t = shape_of(p);  // the indexing of the integer form
  t.imin_groups = S;
  AlignedBuffer im(size_t(p.num_experts * NB * t.imin_pairs() * 32) * 2), dm(size_t(p.num_experts * NB * t.imin_runs() * 16) * 4);
  std::memset(im.data(), 0, im.size());
  std::memset(dm.data(), 0, dm.size());
  const bool ok = factor_runs<int16_t>(
      p, -mmax, mmax, 64, [&](int64_t e, int64_t n, int64_t gi) { return p.min(e, n, gi); },
      [&](int64_t e, int64_t n, int64_t r, float d, const int16_t* m, int cnt) {
        dm.as<float>()[t.dmin_index(e, n, r)] = d;
        for (int j = 0; j < cnt; ++j) im.as<int16_t>()[t.imin_index(e, n, r * S + j)] = m[j];
      });
  if (!ok) return;
  p.imins = std::move(im), p.dmins = std::move(dm), p.imin_groups = S;
  p.mins = AlignedBuffer();
}

void derive_int_scales(PackedExperts& p) {
  constexpr int64_t S = kIMinRun;
  const int64_t NB = p.num_blocks();
  if (p.scheme != Scheme::kInt4W4A8 || !p.kernel || !p.kernel->int_scales || p.iscale_groups || p.group_size <= 0 ||
      p.num_groups() < 2)
    return;
  PackedExperts t = shape_of(p);  // the indexing of the integer form
  t.iscale_groups = S;
  AlignedBuffer is(size_t(p.num_experts * NB * t.iscale_runs() * S * 16)), ds(size_t(p.num_experts * NB * t.iscale_runs() * 16) * 4);
  std::memset(is.data(), 0, is.size());
  std::memset(ds.data(), 0, ds.size());
  const bool ok = factor_runs<int8_t>(  // int8; 8-bit integer scales need c up to 128
      p, -128, 127, 128, [&](int64_t e, int64_t n, int64_t gi) { return p.scale(e, n, gi); },
      [&](int64_t e, int64_t n, int64_t r, float d, const int8_t* m, int cnt) {
        ds.as<float>()[t.dscale_index(e, n, r)] = d;
        for (int j = 0; j < cnt; ++j) is.as<int8_t>()[t.iscale_index(e, n, r * S + j)] = m[j];
      });
  if (!ok) return;
  p.iscales = std::move(is), p.dscales = std::move(ds), p.iscale_groups = S;
  p.scales = AlignedBuffer();
}

AlignedBuffer float_scales(const PackedExperts& p) {
  return blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return p.scale(e, n, gi); });
}

void set_kernel(PackedExperts& p, const KernelDesc* kd) {
  p.kernel = kd;
  if (p.imin_groups && !kd->int_mins) p.mins = float_mins(p), p.imins = AlignedBuffer(), p.dmins = AlignedBuffer(), p.imin_groups = 0;
  if (p.iscale_groups && !kd->int_scales)
    p.scales = float_scales(p), p.iscales = AlignedBuffer(), p.dscales = AlignedBuffer(), p.iscale_groups = 0;
  derive_int_mins(p);
  derive_int_scales(p);
}

AlignedBuffer float_mins(const PackedExperts& p) {
  if (!p.has_mins) return AlignedBuffer();
  return blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return p.min(e, n, gi); });
}

PackedExperts pack_int4(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const uint8_t* zeros, const int8_t* codebook, const float* mins) {
  check_dims(E, N, K);
  check_group(group_size, K, true);
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
  p.kernel = select_kernel(p);
  derive_int_mins(p);
  derive_int_scales(p);
  return p;
}

PackedExperts pack_int8(const int8_t* q, int64_t E, int64_t N, int64_t K, const float* scales,
                        int64_t group_size, const float* mins) {
  check_dims(E, N, K);
  check_group(group_size, K, false);
  PackedExperts p = make(Scheme::kInt8W8A8, E, N, K, group_size);
  const int64_t G = p.num_groups();
  check_scales(scales, E * N * G, "scales");
  p.scales = blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return scales[(e * N + n) * G + gi]; });
  set_mins(p, mins);
  fill_panels<uint32_t>(p, q, 1, 0x80808080u);
  p.kernel = select_kernel(p);
  derive_int_mins(p);
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
  const int64_t ns = E * ((N + block_n - 1) / block_n) * p.num_groups();
  check_scales(scale_inv, ns, "scale_inv");
  const int64_t nbn = (N + block_n - 1) / block_n, kb = p.num_groups();
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
