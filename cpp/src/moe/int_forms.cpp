// int_forms.cpp — factoring group scales and mins as d * integer per run of groups (exact, bit for bit),
// and the way back to floats.
#include "moe/int_forms.h"
#include "moe/split_codes.h"
#include "moe/qword_panels.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "common/numeric.h"
#include "dispatch/registry.h"
#include "moe_cpu/errors.h"

namespace moe_cpu {

namespace {

// v[0..n) = float(m[j]) * d bit for bit (signed zeros too), m[j] an integer in [mlo, mhi], d one float that is
// exactly an fp16 value (*h, its code): candidates d = a / (+-c) for the nonzero a of least magnitude and
// c = 1..cmax (K-quant mins and scales are an fp16 d * a 6-bit integer, IQ4_XS's d * (6-bit - 32)). False if none.
template <class I>
bool factor_run(const float* v, int n, int32_t mlo, int32_t mhi, int cmax, uint16_t* h, I* m) {
  float a = 0.f;
  for (int j = 0; j < n; ++j)
    if (v[j] != 0.f && (a == 0.f || std::fabs(v[j]) < std::fabs(a))) a = v[j];
  if (a == 0.f) {  // all zero (a zero d): d = +0, and m = -1 gives -0 (-1 * +0), m = 0 gives +0
    for (int j = 0; j < n; ++j)
      if (std::signbit(v[j]) && mlo > -1) return false;
    *h = 0;
    for (int j = 0; j < n; ++j) m[j] = std::signbit(v[j]) ? I(-1) : I(0);
    return true;
  }
  for (int c = 1; c <= cmax; ++c)
    for (int sign = 1; sign >= -1; sign -= 2) {
      const float dc = a / float(sign * c);
      if (dc == 0.f || !std::isfinite(dc)) return false;
      bool ok = half_exact(dc, h);
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
      if (ok) return true;
    }
  return false;
}

// Factors every run of S groups of every column of p: value(e, n, gi) = float(m) * d (factor_run
// with m in [mlo, mhi], cmax). Calls put(e, n, run, d (fp16 code), m, count) per run; false as soon as one does not
// factor.
template <class I, int64_t S = kIMinRun, class Value, class Put>
bool factor_runs(const PackedExperts& p, int32_t mlo, int32_t mhi, int cmax, Value value, Put put) {
  const int64_t G = p.num_groups(), NB = p.num_blocks(), N = p.out_features, runs = (G + S - 1) / S;
  std::atomic<bool> ok{true};
  parallel_for(p.num_experts * NB, [&](int64_t eb) {
    const int64_t e = eb / NB, b16 = eb % NB;
    float v[S];
    uint16_t d;
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
PackedExperts shape_of(const PackedExperts& p) {
  PackedExperts t;
  t.scheme = p.scheme, t.num_experts = p.num_experts, t.out_features = p.out_features, t.in_features = p.in_features;
  t.group_size = p.group_size;
  return t;
}

}  // namespace

// Whether p's kernel reads integer mins: KernelDesc::int_mins, or split codes (their kernel takes them).
static bool takes_int_mins(const PackedExperts& p) { return p.kernel && (p.kernel->int_mins || p.split_bits); }

// Builds the integer mins when p.kernel takes them and every run of 8 groups factors exactly (a no-op otherwise).
static void derive_int_mins(PackedExperts& p) {
  constexpr int64_t S = kIMinRun;
  const int64_t gl = p.group_len(), NB = p.num_blocks();
  // (with activation blocks too: a block per run scales the run's int32 sum, shorter blocks meet the ints in fp32)
  if (!p.has_mins || !takes_int_mins(p) || p.imin_groups || gl * 127 > 32767) return;
  // int8 mins (K-quants' are 6-bit), int16 code sums (|sum| <= 127 gl) and an int32 sum of S products per run
  const int32_t mmax = int32_t(std::min<int64_t>(127, (int64_t(1) << 31) / (S * 127 * gl) - 1));
  PackedExperts t = shape_of(p);  // the indexing of the integer form
  t.imin_groups = S;
  AlignedBuffer im(size_t(p.num_experts * NB * imin_pairs(t) * 32)), dm(size_t(p.num_experts * NB * int_form_runs(t.num_groups()) * 16) * 2);
  std::memset(im.data(), 0, im.size());
  std::memset(dm.data(), 0, dm.size());
  const bool ok = factor_runs<int8_t>(
      p, -mmax, mmax, 64, [&](int64_t e, int64_t n, int64_t gi) { return p.min(e, n, gi); },
      [&](int64_t e, int64_t n, int64_t r, uint16_t d, const int8_t* m, int cnt) {
        dm.as<uint16_t>()[int_d_index(t, e, n, r)] = d;
        for (int j = 0; j < cnt; ++j) im.as<int8_t>()[imin_index(t, e, n, r * S + j)] = m[j];
      });
  if (!ok) return;
  p.imins = std::move(im), p.dmins = std::move(dm), p.imin_groups = S;
  p.mins = AlignedBuffer();
}

// Builds the integer scales when p.kernel takes them (int groups) and every run of 8 groups factors exactly as
// d * int8 (a no-op otherwise).
static void derive_int_scales(PackedExperts& p) {
  constexpr int64_t S = kIMinRun;
  const int64_t NB = p.num_blocks();
  if (!is_int_scheme(p.scheme) || !p.kernel || !p.kernel->int_scales || p.iscale_groups || p.group_size <= 0 ||
      p.num_groups() < 2)
    return;
  PackedExperts t = shape_of(p);  // the indexing of the integer form
  t.iscale_groups = S;
  AlignedBuffer is(size_t(p.num_experts * NB * int_form_runs(t.num_groups()) * S * 16)), ds(size_t(p.num_experts * NB * int_form_runs(t.num_groups()) * 16) * 2);
  std::memset(is.data(), 0, is.size());
  std::memset(ds.data(), 0, ds.size());
  const bool ok = factor_runs<int8_t>(  // int8; 8-bit integer scales need c up to 128
      p, -128, 127, 128, [&](int64_t e, int64_t n, int64_t gi) { return p.scale(e, n, gi); },
      [&](int64_t e, int64_t n, int64_t r, uint16_t d, const int8_t* m, int cnt) {
        ds.as<uint16_t>()[int_d_index(t, e, n, r)] = d;
        for (int j = 0; j < cnt; ++j) is.as<int8_t>()[iscale_index(t, e, n, r * S + j)] = m[j];
      });
  if (!ok) return;
  p.iscales = std::move(is), p.dscales = std::move(ds), p.iscale_groups = S;
  p.scales = AlignedBuffer(), p.half_scales = false;
}

// Puts both integer forms in 4 bits when p.kernel takes them (2-bit split codes in groups of 16 with mins: GGUF
// Q2_K), and every span of kNibbleSpan groups of scales, and of mins, factors as one fp16 d times integers in [0, 15]
// (a no-op otherwise).
static void derive_int_nibbles(PackedExperts& p) {
  constexpr int64_t S = kNibbleSpan;
  if (!p.kernel || !p.kernel->int_nibbles || p.int_nibbles || p.split_bits != 2 || p.group_len() != 16 || !p.has_mins ||
      !p.iscale_groups || !p.imin_groups)
    return;
  const int64_t NB = p.num_blocks(), pairs = imin_pairs(p), spans = int_nibble_spans(p.num_groups());
  AlignedBuffer f[2], d[2];  // scales, mins
  for (int i = 0; i < 2; ++i) {
    f[i] = AlignedBuffer(size_t(p.num_experts * NB * pairs * 16)), d[i] = AlignedBuffer(size_t(p.num_experts * NB * spans * 16) * 2);
    std::memset(f[i].data(), 0, f[i].size());
    std::memset(d[i].data(), 0, d[i].size());
    const bool ok = factor_runs<int8_t, S>(
        p, 0, 15, 15, [&](int64_t e, int64_t n, int64_t gi) { return i ? p.min(e, n, gi) : p.scale(e, n, gi); },
        [&](int64_t e, int64_t n, int64_t r, uint16_t h, const int8_t* m, int cnt) {
          d[i].as<uint16_t>()[nibble_d_index(p, e, n, r)] = h;
          for (int j = 0; j < cnt; ++j) f[i].as<uint8_t>()[nibble_index(p, e, n, r * S + j)] |= uint8_t(m[j] << (4 * (j % 2)));
        });
    if (!ok) return;
  }
  p.iscales = std::move(f[0]), p.dscales = std::move(d[0]), p.imins = std::move(f[1]), p.dmins = std::move(d[1]);
  p.int_nibbles = true;
}

// Back to the floats from the 4-bit forms (a kernel that does not read them).
static void join_int_nibbles(PackedExperts& p) {
  p.scales = float_scales(p), p.mins = float_mins(p);
  p.iscales = AlignedBuffer(), p.dscales = AlignedBuffer(), p.imins = AlignedBuffer(), p.dmins = AlignedBuffer();
  p.iscale_groups = p.imin_groups = 0, p.int_nibbles = false;
}

// Stores the scales as fp16 when p.kernel takes them, they are not integer, and every one is exactly an fp16 value
// (a no-op otherwise).
static void derive_half_scales(PackedExperts& p) {
  if (!is_int_scheme(p.scheme) || !p.kernel || !p.kernel->half_scales || p.half_scales || p.iscale_groups) return;
  const int64_t n = int64_t(p.scales.size() / 4);
  AlignedBuffer h(size_t(n) * 2);
  const float* s = p.scales.as<float>();
  uint16_t* d = h.as<uint16_t>();
  std::atomic<bool> ok{true};
  constexpr int64_t kChunk = 1 << 16;
  parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk) && ok.load(std::memory_order_relaxed); ++i)
      if (!half_exact(s[i], d + i)) ok = false;
  });
  if (!ok) return;
  p.scales = std::move(h), p.half_scales = true;
}

float PackedExperts::half_scale(int64_t i) const { return half_to_float(scales.as<uint16_t>()[i]); }

float PackedExperts::int_scale(int64_t e, int64_t n, int64_t gi) const {
  if (int_nibbles)
    return half_to_float(dscales.as<uint16_t>()[nibble_d_index(*this, e, n, gi / kNibbleSpan)]) *
           float((iscales.as<uint8_t>()[nibble_index(*this, e, n, gi)] >> (4 * (gi % 2))) & 15);
  return half_to_float(dscales.as<uint16_t>()[int_d_index(*this, e, n, gi / kIMinRun)]) * float(iscales.as<int8_t>()[iscale_index(*this, e, n, gi)]);
}

float PackedExperts::int_min(int64_t e, int64_t n, int64_t gi) const {
  if (int_nibbles)
    return half_to_float(dmins.as<uint16_t>()[nibble_d_index(*this, e, n, gi / kNibbleSpan)]) *
           float((imins.as<uint8_t>()[nibble_index(*this, e, n, gi)] >> (4 * (gi % 2))) & 15);
  return half_to_float(dmins.as<uint16_t>()[int_d_index(*this, e, n, gi / kIMinRun)]) * float(imins.as<int8_t>()[imin_index(*this, e, n, gi)]);
}

AlignedBuffer float_scales(const PackedExperts& p) {
  return blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return p.scale(e, n, gi); });
}

void set_kernel(PackedExperts& p, const KernelDesc* kd) {
  const bool was3 = p.kernel && p.kernel->split3;
  p.kernel = kd;
  if (p.int_nibbles && (!kd->int_nibbles || !kd->split_codes)) join_int_nibbles(p);
  // (a 4-bit split made for a kernel without 3-bit codes is split again: its codes may span 8 values)
  if (p.split_bits && (!kd->split_codes || (p.split_bits == 3 && !kd->split3) || (p.split_bits == 4 && kd->split3 && !was3)))
    join_split_codes(p);
  if (kd->split_codes) derive_split_codes(p, kd->split3);  // first: split codes take integer mins
  if (p.qword_panels && !kd->qword_panels) join_qword_panels(p);
  if (kd->qword_panels) derive_qword_panels(p);
  if (p.imin_groups && !takes_int_mins(p)) p.mins = float_mins(p), p.imins = AlignedBuffer(), p.dmins = AlignedBuffer(), p.imin_groups = 0;
  if (p.iscale_groups && !kd->int_scales)
    p.scales = float_scales(p), p.iscales = AlignedBuffer(), p.dscales = AlignedBuffer(), p.iscale_groups = 0;
  if (p.half_scales && !kd->half_scales) p.scales = float_scales(p), p.half_scales = false;
  derive_int_mins(p);
  derive_int_scales(p);
  derive_int_nibbles(p);
  derive_half_scales(p);
}

void set_a16(PackedExperts& p, bool a16) {
  if (a16 && !is_int_scheme(p.scheme))
    throw ValueError(msg(scheme_name(p.scheme), " weights have no 16-bit activation choice (their activations are bf16 "
                         "already); int4_w4a16 / int8_w8a16 take int4 / int8 weights"));
  if (p.a16 == a16 && p.kernel) return;
  if (a16 && p.act_block)
    throw ValueError(msg("these weights run A8 with act_block = ", p.act_block, "; 16-bit activations are per token (set "
                         "act_block None first)"));
  p.a16 = a16;
  set_kernel(p, select_kernel(p));
}

void set_act_block(PackedExperts& p, int64_t B) {
  if (B == p.act_block) return;
  if (B == 0) {
    p.act_block = 0;
    return set_kernel(p, select_kernel(p));
  }
  if (!is_int_scheme(p.scheme) || p.a16)
    throw ValueError(msg("act_block = ", B, ": activation blocks apply to the A8 schemes (int4_w4a8, int8_w8a8); ",
                         scheme_name(p.run_scheme()), " weights take none (pass None)"));
  if (B != 32 && B != 64 && B != 128 && B != 256)
    throw ValueError(msg("act_block = ", B, " is not supported: use 32, 64, 128, 256, or None for one scale per token"));
  const int64_t K = p.in_features, gl = p.group_len();
  if (K % B)
    throw ValueError(msg("act_block = ", B, " does not divide the GEMM's K = ", K, " (valid: the sizes among 32, 64, 128, 256 that divide K, or None)"));
  if (gl % B && B % gl)
    throw ValueError(msg("act_block = ", B, " neither divides the weights' group_size = ", gl,
                         " nor is a multiple of it: an activation block must nest with the scale groups"));
  if (p.has_k_perm())
    throw ValueError(msg("act_block = ", B, ": act-order weights (g_idx) take per-token activations only (their channels "
                         "are gathered out of order, across activation blocks); pass None"));
  p.act_block = B;
  set_kernel(p, select_kernel(p));
}

AlignedBuffer float_mins(const PackedExperts& p) {
  if (!p.has_mins) return AlignedBuffer();
  return blocked<float>(p, [&](int64_t e, int64_t n, int64_t gi) { return p.min(e, n, gi); });
}

}  // namespace moe_cpu
