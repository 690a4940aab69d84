// test_fused_moe.cpp — every registered kernel's GEMM against a direct computation (table-driven),
// and the fused pipeline against a naive double-precision model of the numerics contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/numeric.h"
#include "dispatch/registry.h"
#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"
#include "moe/activations.h"
#include "moe/int_forms.h"
#include "moe_cpu/fused_moe.h"
#include "kernel_test_util.h"
#include "test_util.h"

namespace moe_cpu {
namespace {
using test::Acts;
using test::runnable;
using test::int_kernels;

constexpr double kTolInt = 1e-5;    // int GEMMs: exact integer sums, fp32 group sums
constexpr double kTolFloat = 1e-5;  // bf16 / fp8 GEMMs: fp32 sums of exact products

struct GemmCase { const char* label; int64_t rows, N, K, group; };
const GemmCase kCases[] = {
    {"M1", 1, 5, 64, 32},          {"M3_KOneGroup", 3, 7, 128, 128}, {"M257", 257, 3, 64, 64},
    {"NOdd_PerChannel", 4, 33, 96, -1}, {"Group96", 2, 9, 192, 96},   {"KOdd_PerChannel", 5, 50, 37, -1},
    {"ManyBlocks", 7, 100, 256, 32},   {"DecodeManyBlocks", 1, 100, 256, 32}, {"FewRowsManyBlocks", 3, 77, 64, -1},
    // K below, equal to and above the largest k-step (8, int4), per channel
    {"KBelowStep", 4, 20, 3, -1},      {"KEqualStep", 3, 17, 8, -1},           {"KAboveStep", 5, 18, 9, -1},
};

class GemmKernelTest : public ::testing::TestWithParam<const KernelDesc*> {};

// Expected GEMM computed from the raw codes and scales that were packed. Rows are read through a
// reversed row_idx, and a column range that starts after block 0 is checked too.
TEST_P(GemmKernelTest, MatchesDirectComputationOnOddShapes) {
  const KernelDesc* kd = runnable(GetParam());
  if (kd != GetParam()) RecordProperty("ran", kd->name);
  MOE_CPU_SKIP_UNLESS_RUNNABLE(kd);
  auto g = test::rng_for_test();
  int ran = 0;
  for (const GemmCase& c : kCases) {
    SCOPED_TRACE(c.label);
    const int64_t E = 2, e = 1, N = c.N, K = c.K, R = c.rows;
    const int64_t gl = c.group > 0 ? c.group : K, G = K / gl;
    std::vector<double> want(size_t(R * N), 0.0);
    Acts acts;
    PackedExperts p;
    std::vector<int8_t> aq;
    std::vector<uint16_t> ab;
    if (is_int_scheme(kd->scheme)) {
      const bool int4 = weight_scheme(kd->scheme) == Scheme::kInt4W4A8, a16 = is_a16_scheme(kd->scheme);
      const bool zp = int4 && (c.group == 64 || c.group == 96);  // zero points in two of the cases
      auto q = zp ? test::ints(g, E * N * K, 0, 15) : int4 ? test::ints(g, E * N * K, -8, 7) : test::ints(g, E * N * K, -128, 127);
      auto s = test::gaussian(g, E * N * G);
      if (c.group == 32)  // fp16 values, as GGUF's Q4_0 / Q8_0 d: the kernels that read fp16 scales take them
        for (float& v : s) v = std::ldexp(std::nearbyint(std::ldexp(std::clamp(v, -3.9f, 3.9f), 9)), -9);
      auto z8 = test::ints(g, E * N * G, 0, 15);
      std::vector<uint8_t> z(z8.begin(), z8.end());
      p = int4 ? pack_int4(q.data(), E, N, K, s.data(), c.group, zp ? z.data() : nullptr, nullptr, nullptr, a16)
               : pack_int8(q.data(), E, N, K, s.data(), c.group, nullptr, a16);
      if (zp)  // expected values use q - zero
        for (int64_t i = 0; i < E * N * K; ++i) q[i] = int8_t(q[i] - z[(i / K) * G + (i % K) / gl]);
      aq = test::ints(g, R * K, -127, 127);
      auto as = test::gaussian(g, R);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t gi = 0; gi < G; ++gi) {
            int64_t dot = 0;
            for (int64_t k = gi * gl; k < (gi + 1) * gl; ++k) dot += int64_t(aq[r * K + k]) * q[(e * N + n) * K + k];
            want[r * N + n] += double(dot) * s[(e * N + n) * G + gi] * as[r];
          }
      const int64_t Kp = p.padded_k();
      acts.q.assign(size_t(R * Kp), 0);
      acts.asum.assign(size_t(R * G), 0);
      acts.s = as;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t k = 0; k < K; ++k) {
          acts.q[r * Kp + k] = aq[r * K + k];
          acts.asum[r * G + k / gl] += aq[r * K + k];
        }
    } else {
      auto w = test::gaussian(g, E * N * K);
      std::vector<float> deq(w.size());
      if (kd->scheme == Scheme::kBf16) {
        std::vector<uint16_t> b(w.size());
        for (size_t i = 0; i < w.size(); ++i) b[i] = float_to_bf16(w[i]), deq[i] = bf16_to_float(b[i]);
        p = pack_bf16(b.data(), E, N, K);
      } else {
        p = quantize_experts(w.data(), E, N, K, Scheme::kFp8W8A16, -1, 4, gl);
        unpack(p, deq.data());
      }
      auto a = test::gaussian(g, R * K);
      ab.resize(a.size());
      for (size_t i = 0; i < a.size(); ++i) ab[i] = float_to_bf16(a[i]);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k)
            want[r * N + n] += double(bf16_to_float(ab[r * K + k])) * deq[(e * N + n) * K + k];
      const int64_t Kp = p.padded_k();
      acts.b.assign(size_t(R * Kp), 0);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t k = 0; k < K; ++k) acts.b[r * Kp + k] = ab[r * K + k];
      acts.widen();
    }
    // Every kernel reads the same layout, so it runs on these weights whatever dispatch chose, once the scales
    // take the form it reads (set_kernel: fp16 or integer where they are exact), unless the case is outside its limits.
    if (kd->supports && !kd->supports(p)) continue;
    set_kernel(p, kd);
    // Rows in reverse order through row_idx: GEMM row r reads buffer row R-1-r.
    acts.idx.resize(size_t(R));
    for (int64_t r = 0; r < R; ++r) acts.idx[r] = int32_t(R - 1 - r);
    std::vector<double> want_rev(want.size());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = 0; n < N; ++n) want_rev[r * N + n] = want[(R - 1 - r) * N + n];
    ++ran;
    std::vector<float> got(size_t(R * N), NAN);
    const int64_t blocks = p.num_blocks();
    kd->gemm(p, e, 0, blocks, acts.view(p, R), got.data(), N);
    if (const KernelDesc* twin = test::amx_twin(kd)) {  // the per-expert choice between them changes no bit
      std::vector<float> ref(got.size(), NAN);
      twin->gemm(p, e, 0, blocks, acts.view(p, R), ref.data(), N);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(float_to_bits(got[i]), float_to_bits(ref[i])) << kd->name << " vs " << twin->name << " at " << i;
    }
    const double tol = is_int_scheme(kd->scheme) ? kTolInt : kTolFloat;
    EXPECT_LT(test::rel_max_err(got, want_rev), tol) << kd->name;
    {  // rows in order: consecutive buffer rows 1..R (which a kernel may read in place) after another row
      Acts in_order = acts;
      const int64_t Kp = p.padded_k(), G = p.num_groups();
      if (!acts.q.empty()) {
        in_order.q.insert(in_order.q.begin(), acts.q.end() - Kp, acts.q.end());
        in_order.asum.insert(in_order.asum.begin(), acts.asum.end() - G, acts.asum.end());
        in_order.s.insert(in_order.s.begin(), acts.s.back());
      } else {
        in_order.b.insert(in_order.b.begin(), acts.b.end() - Kp, acts.b.end());
        in_order.widen();
      }
      for (int64_t r = 0; r < R; ++r) in_order.idx[r] = int32_t(r + 1);
      std::vector<float> got2(size_t(R * N), NAN);
      kd->gemm(p, e, 0, blocks, in_order.view(p, R), got2.data(), N);
      EXPECT_LT(test::rel_max_err(got2, want), is_int_scheme(kd->scheme) ? kTolInt : kTolFloat) << kd->name << " rows in order";
    }
    if (blocks > 1) {  // columns [16, N) only, written from c[0]
      std::vector<float> part(size_t(R * (N - 16)), NAN);
      kd->gemm(p, e, 1, blocks, acts.view(p, R), part.data(), N - 16);
      std::vector<double> want_part(part.size());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 16; n < N; ++n) want_part[r * (N - 16) + n - 16] = want_rev[r * N + n];
      EXPECT_LT(test::rel_max_err(part, want_part), tol) << kd->name << " column range";
    }
  }
  EXPECT_GE(ran, 5) << kd->name << " supports too few of the cases";
}

// Random activation rows for `p` (int codes with group sums and scales, or bf16 and fp32).
Acts random_acts(std::mt19937& g, const PackedExperts& p, int64_t R) {
  Acts a;
  const int64_t K = p.in_features, Kp = p.padded_k(), G = p.num_groups(), gl = p.group_len();
  if (is_int_scheme(p.scheme)) {
    a.q.assign(size_t(R * Kp), 0);
    a.asum.assign(size_t(R * G), 0);
    a.s = test::gaussian(g, size_t(R));
    const auto q = test::ints(g, size_t(R * K), -127, 127);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) a.q[r * Kp + k] = q[r * K + k], a.asum[r * G + k / gl] += q[r * K + k];
  } else {
    a.b.assign(size_t(R * Kp), 0);
    const auto x = test::gaussian(g, size_t(R * K));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) a.b[r * Kp + k] = float_to_bf16(x[r * K + k]);
    a.widen();
  }
  return a;
}

// A row's output bits do not depend on the rows computed with it: one row (decode), a few rows
// and many rows take different tile paths (and K above a float kernel's scratch chunk).
// (The Eigen reference GEMMs are not batch-invariant: SIMD kernels only.)
class BatchInvarianceTest : public ::testing::TestWithParam<const KernelDesc*> {};

TEST_P(BatchInvarianceTest, RowBitsDoNotDependOnTheRowsBesideThem) {
  const KernelDesc* kd = runnable(GetParam());
  MOE_CPU_SKIP_UNLESS_RUNNABLE(kd);
  auto g = test::rng_for_test();
  const int64_t E = 1, N = 40, R = 13;
  for (const int64_t K : {64, 640}) {
    for (const int64_t group : {int64_t(-1), int64_t(32)}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " group=" + std::to_string(group));
      const auto wf = test::gaussian(g, size_t(E * N * K));
      PackedExperts p;
      if (kd->scheme == Scheme::kFp8W8A16) p = quantize_experts(wf.data(), E, N, K, kd->scheme, -1, 16, group > 0 ? 96 : K);
      else if (weight_scheme(kd->scheme) == Scheme::kInt4W4A8) p = quantize_experts(wf.data(), E, N, K, kd->scheme, group, 128, 128);
      else p = quantize_experts(wf.data(), E, N, K, kd->scheme, -1, 128, 128);
      if (kd->supports && !kd->supports(p)) continue;
      set_kernel(p, kd);
      Acts acts = random_acts(g, p, R);
      acts.idx.resize(size_t(R));
      for (int64_t r = 0; r < R; ++r) acts.idx[r] = int32_t((r * 5) % R);
      std::vector<float> all(size_t(R * N));
      kd->gemm(p, 0, 0, p.num_blocks(), acts.view(p, R), all.data(), N);
      for (const int64_t rows : {int64_t(1), int64_t(3), int64_t(7)}) {
        for (int64_t r0 = 0; r0 + rows <= R; r0 += rows) {
          Acts sub = acts;
          sub.idx.assign(acts.idx.begin() + r0, acts.idx.begin() + r0 + rows);
          std::vector<float> part(size_t(rows * N));
          kd->gemm(p, 0, 0, p.num_blocks(), sub.view(p, rows), part.data(), N);
          for (int64_t i = 0; i < rows * N; ++i)
            ASSERT_EQ(float_to_bits(part[i]), float_to_bits(all[r0 * N + i]))
                << kd->name << ": rows " << rows << " from " << r0 << ", element " << i;
        }
      }
    }
  }
}

// Int kernels at the extremes of their integer sums: every weight code at its largest magnitude and
// every activation at +-127 (A16: +-32766) of one sign over a whole group or channel (the AVX2 int4 kernel
// sums 8 vpmaddubsw results in int16 before widening; A16 sums run over pieces of 256). Exact in double.
class IntExtremesTest : public ::testing::TestWithParam<const KernelDesc*> {};

TEST_P(IntExtremesTest, LargestSumsAreExact) {
  const KernelDesc* kd = runnable(GetParam());
  MOE_CPU_SKIP_UNLESS_RUNNABLE(kd);
  const int64_t E = 1, N = 32, K = 512, R = 5;
  const bool int4 = weight_scheme(kd->scheme) == Scheme::kInt4W4A8, a16 = is_a16_scheme(kd->scheme);
  for (const int64_t group : {int64_t(128), int64_t(-1)})
  for (const int w_sign : {1, -1}) {
    const int64_t G = group > 0 ? K / group : 1, gl = K / G;
    // int4 symmetric codes in [-8, 7] (stored + 8 in [0, 15]); int8 in [-128, 127]
    std::vector<int8_t> q(size_t(E * N * K), int8_t(w_sign > 0 ? (int4 ? 7 : 127) : (int4 ? -8 : -128)));
    const std::vector<float> s(size_t(E * N * G), 1.0f);
    PackedExperts p = int4 ? pack_int4(q.data(), E, N, K, s.data(), group, nullptr, nullptr, nullptr, a16)
                           : pack_int8(q.data(), E, N, K, s.data(), group, nullptr, a16);
    if (kd->supports && !kd->supports(p)) continue;
    set_kernel(p, kd);
    Acts acts;
    const int mul = a16 ? 258 : 1;  // 127 * 258 = 32766
    acts.a16_mul = mul;
    const int64_t Kp = p.padded_k();
    acts.q.assign(size_t(R * Kp), 0);
    acts.asum.assign(size_t(R * G), 0);
    acts.s.assign(size_t(R), 1.0f);
    acts.idx.resize(size_t(R));
    for (int64_t r = 0; r < R; ++r) {
      acts.idx[r] = int32_t(r);
      const int8_t v = r % 2 ? int8_t(-127) : int8_t(127);
      for (int64_t k = 0; k < K; ++k) acts.q[r * Kp + k] = v, acts.asum[r * G + k / gl] += v;
    }
    for (const int64_t rows : {int64_t(1), R}) {
      std::vector<float> got(size_t(rows * N));
      kd->gemm(p, 0, 0, p.num_blocks(), acts.view(p, rows), got.data(), N);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(double(got[r * N + n]), double(q[0]) * (r % 2 ? -127.0 : 127.0) * mul * double(K))
              << kd->name << " group " << group << " weight sign " << w_sign << ", rows " << rows << ", row " << r << ", column " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(IntKernels, IntExtremesTest, ::testing::ValuesIn(int_kernels()),
                         [](const auto& info) { return std::string(info.param->name); });

std::vector<const KernelDesc*> simd_kernels() {
  std::vector<const KernelDesc*> out;
  for (const KernelDesc* k : all_kernels())
    if (std::string(k->isa) != "reference") out.push_back(k);
  return out;
}
INSTANTIATE_TEST_SUITE_P(SimdKernels, BatchInvarianceTest, ::testing::ValuesIn(simd_kernels()),
                         [](const auto& info) { return std::string(info.param->name); });

INSTANTIATE_TEST_SUITE_P(AllKernels, GemmKernelTest, ::testing::ValuesIn(all_kernels()),
                         [](const auto& info) { return std::string(info.param->name); });

// Every e4m3fn code through each fp8 kernel: weight row 0 holds all 254 finite codes, activation
// row r is one-hot at k = r, so output (r, 0) must be the decoded code exactly (scale 1).
class Fp8KernelTest : public ::testing::TestWithParam<const KernelDesc*> {};

TEST_P(Fp8KernelTest, DecodesEveryFiniteCodeExactly) {
  const KernelDesc* kd = GetParam();
  MOE_CPU_SKIP_UNLESS_RUNNABLE(kd);
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if (!e4m3fn_is_nan(uint8_t(c))) codes.push_back(uint8_t(c));
  const int64_t K = int64_t(codes.size()), N = 3;
  std::vector<uint8_t> w(size_t(N * K), 0);
  std::copy(codes.begin(), codes.end(), w.begin());
  const float one = 1.f;
  PackedExperts p = pack_fp8(w.data(), 1, N, K, &one, N, K);
  ASSERT_TRUE(kd->supports == nullptr || kd->supports(p));
  Acts acts;
  acts.b.assign(size_t(K * p.padded_k()), 0);
  acts.idx.resize(size_t(K));
  for (int64_t r = 0; r < K; ++r) acts.b[r * p.padded_k() + r] = float_to_bf16(1.f), acts.idx[r] = int32_t(r);
  acts.widen();
  std::vector<float> c(size_t(K * N));
  kd->gemm(p, 0, 0, 1, acts.view(p, K), c.data(), N);
  for (int64_t r = 0; r < K; ++r) EXPECT_EQ(c[r * N], e4m3fn_to_float(codes[r])) << "code " << int(codes[r]);
}

std::vector<const KernelDesc*> fp8_kernels() {
  std::vector<const KernelDesc*> out;
  for (const KernelDesc* k : all_kernels())
    if (k->scheme == Scheme::kFp8W8A16) out.push_back(k);
  return out;
}
INSTANTIATE_TEST_SUITE_P(Fp8Kernels, Fp8KernelTest, ::testing::ValuesIn(fp8_kernels()),
                         [](const auto& info) { return std::string(info.param->name); });

// ---- fused pipeline ----
struct Layer {
  int64_t E, H, I;
  std::vector<float> w13, w2;  // float weights [E,2I,H], [E,H,I]
};
Layer make_layer(std::mt19937& g, int64_t E, int64_t H, int64_t I) {
  return Layer{E, H, I, test::gaussian(g, E * 2 * I * H, 0.1f), test::gaussian(g, E * H * I, 0.1f)};
}

// Naive double model of the bf16 scheme with silu: bf16-rounded inputs, weights and intermediates.
std::vector<double> naive_bf16(const Layer& L, const std::vector<float>& x, int64_t M, const std::vector<int32_t>& ids,
                               const std::vector<float>& tw, int64_t k) {
  std::vector<double> out(size_t(M * L.H), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[m * k + j];
      if (e < 0) continue;
      std::vector<double> y(size_t(2 * L.I), 0.0), act(size_t(L.I));
      for (int64_t n = 0; n < 2 * L.I; ++n)
        for (int64_t h = 0; h < L.H; ++h)
          y[n] += double(round_bf16(x[m * L.H + h])) * round_bf16(L.w13[(e * 2 * L.I + n) * L.H + h]);
      for (int64_t i = 0; i < L.I; ++i) act[i] = round_bf16(float(y[i] / (1 + std::exp(-y[i])) * y[L.I + i]));
      for (int64_t h = 0; h < L.H; ++h) {
        double s = 0;
        for (int64_t i = 0; i < L.I; ++i) s += act[i] * round_bf16(L.w2[(e * L.H + h) * L.I + i]);
        out[m * L.H + h] += tw[m * k + j] * s;
      }
    }
  return out;
}

TEST(FusedExperts, Bf16MatchesNaiveModelWithSkippedAndDuplicateIds) {
  auto g = test::rng_for_test();
  const int64_t E = 3, H = 40, I = 24, M = 5, k = 3;
  Layer L = make_layer(g, E, H, I);
  PackedExperts w13 = quantize_experts(L.w13.data(), E, 2 * I, H, Scheme::kBf16, -1, 0, 0);
  PackedExperts w2 = quantize_experts(L.w2.data(), E, H, I, Scheme::kBf16, -1, 0, 0);
  auto x = test::gaussian(g, M * H);
  std::vector<int32_t> ids = {0, 2, -1, 1, 1, 0, 2, 2, 2, -1, -1, 0, 1, 0, 2};
  auto tw = test::gaussian(g, M * k);
  std::vector<float> out(size_t(M * H));
  FusedMoeArgs a;
  a.x = x.data(), a.M = M, a.H = H, a.w13 = &w13, a.w2 = &w2, a.topk_weights = tw.data();
  a.topk_ids = ids.data(), a.k = k, a.out = out.data();
  fused_experts(a);
  EXPECT_LT(test::rel_max_err(out, naive_bf16(L, x, M, ids, tw, k)), 2e-3);
}

TEST(FusedExperts, BitwiseIdenticalForOneAndTwoThreads) {
  auto g = test::rng_for_test();
  const int64_t E = 4, H = 64, I = 32, M = 9, k = 2;
  Layer L = make_layer(g, E, H, I);
  auto x = test::gaussian(g, M * H);
  std::vector<int32_t> ids(size_t(M * k));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7 + 3) % E);
  auto tw = test::gaussian(g, M * k);
  const int saved = get_num_threads();
  for (Scheme s : {Scheme::kInt4W4A8, Scheme::kInt8W8A8, Scheme::kFp8W8A16, Scheme::kBf16, Scheme::kInt4W4A16, Scheme::kInt8W8A16}) {
    const int64_t group = weight_scheme(s) == Scheme::kInt4W4A8 ? 32 : -1;
    PackedExperts w13 = quantize_experts(L.w13.data(), E, 2 * I, H, s, group, 16, 32);
    PackedExperts w2 = quantize_experts(L.w2.data(), E, H, I, s, group, 16, 32);
    std::vector<float> o1(size_t(M * H)), o2(size_t(M * H));
    FusedMoeArgs a;
    a.x = x.data(), a.M = M, a.H = H, a.w13 = &w13, a.w2 = &w2, a.topk_weights = tw.data();
    a.topk_ids = ids.data(), a.k = k;
    set_num_threads(1);
    a.out = o1.data();
    fused_experts(a);
    set_num_threads(2);
    a.out = o2.data();
    fused_experts(a);
    EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * 4)) << scheme_name(s);
  }
  set_num_threads(saved);
}

TEST(FusedExperts, ExpertMapSplitsTheLayer) {
  // Two "ranks" each holding half the experts sum to the full layer (int8, exact same per-row numerics).
  auto g = test::rng_for_test();
  const int64_t E = 4, H = 32, I = 16, M = 6, k = 2;
  Layer L = make_layer(g, E, H, I);
  auto x = test::gaussian(g, M * H);
  std::vector<int32_t> ids = {0, 3, 1, 2, 2, 0, 3, 1, 0, 1, 2, 3};
  auto tw = test::gaussian(g, M * k);
  PackedExperts w13 = quantize_experts(L.w13.data(), E, 2 * I, H, Scheme::kInt8W8A8, -1, 0, 0);
  PackedExperts w2 = quantize_experts(L.w2.data(), E, H, I, Scheme::kInt8W8A8, -1, 0, 0);
  std::vector<float> full(size_t(M * H)), half0(size_t(M * H)), half1(size_t(M * H));
  FusedMoeArgs a;
  a.x = x.data(), a.M = M, a.H = H, a.w13 = &w13, a.w2 = &w2, a.topk_weights = tw.data();
  a.topk_ids = ids.data(), a.k = k, a.out = full.data();
  fused_experts(a);
  const int32_t map0[4] = {0, 1, -1, -1}, map1[4] = {-1, -1, 2, 3};
  a.num_global_experts = 4;
  a.expert_map = map0, a.out = half0.data();
  fused_experts(a);
  a.expert_map = map1, a.out = half1.data();
  fused_experts(a);
  for (int64_t i = 0; i < M * H; ++i) EXPECT_NEAR(half0[i] + half1[i], full[i], 1e-5f * (1 + std::fabs(full[i])));
}

TEST(FusedExperts, RejectsOutOfRangeIdsAndMismatchedSchemes) {
  auto g = test::rng_for_test();
  Layer L = make_layer(g, 2, 32, 16);
  PackedExperts w13 = quantize_experts(L.w13.data(), 2, 32, 32, Scheme::kBf16, -1, 0, 0);
  PackedExperts w2 = quantize_experts(L.w2.data(), 2, 32, 16, Scheme::kBf16, -1, 0, 0);
  PackedExperts w2i8 = quantize_experts(L.w2.data(), 2, 32, 16, Scheme::kInt8W8A8, -1, 0, 0);
  auto x = test::gaussian(g, 32);
  std::vector<int32_t> ids = {2};
  std::vector<float> tw = {1.f}, out(32);
  FusedMoeArgs a;
  a.x = x.data(), a.M = 1, a.H = 32, a.w13 = &w13, a.w2 = &w2, a.topk_weights = tw.data();
  a.topk_ids = ids.data(), a.k = 1, a.out = out.data();
  EXPECT_THROW(fused_experts(a), ValueError);
  ids[0] = 1;
  a.w2 = &w2i8;
  EXPECT_THROW(fused_experts(a), ValueError);
  // int weights pair in any way with the same activations; A16 with A8 is refused
  PackedExperts w13i4 = quantize_experts(L.w13.data(), 2, 32, 32, Scheme::kInt4W4A8, 32, 0, 0);
  PackedExperts w13a16 = quantize_experts(L.w13.data(), 2, 32, 32, Scheme::kInt4W4A16, 32, 0, 0);
  PackedExperts w2a16 = quantize_experts(L.w2.data(), 2, 32, 16, Scheme::kInt8W8A16, -1, 0, 0);
  a.w13 = &w13i4, a.w2 = &w2i8;
  EXPECT_NO_THROW(fused_experts(a));
  a.w13 = &w13a16, a.w2 = &w2a16;
  EXPECT_NO_THROW(fused_experts(a));
  a.w13 = &w13i4, a.w2 = &w2a16;
  EXPECT_THROW(fused_experts(a), ValueError);
  a.w13 = &w13a16, a.w2 = &w2i8;
  EXPECT_THROW(fused_experts(a), ValueError);
}

}  // namespace
}  // namespace moe_cpu

namespace moe_cpu {
namespace {

// The ISA word each scheme's kernel must have, from MOE_CPU_EXPECT_ISA ("w4a8:avx2 w8a8:avx2 ..."; scripts/test.sh
// sets it where it emulates a CPU); empty where unset.
std::string expected_isa(const char* precision) {
  const char* env = std::getenv("MOE_CPU_EXPECT_ISA");
  std::istringstream in(env ? env : "");
  for (std::string item; in >> item;)
    if (item.rfind(std::string(precision) + ":", 0) == 0) return item.substr(std::strlen(precision) + 1);
  return "";
}

// A shrunk Qwen3-like layer with fixed routing, run by fused_experts in one scheme (and A8 blocks for w13 / w2, 0:
// per token) with the kernels dispatch picks at the active level.
struct DispatchCase {
  int64_t E = 8, H = 256, I, M = 19, k = 2;
  std::mt19937 g;
  Layer L;
  std::vector<float> x, tw;
  std::vector<int32_t> ids;
  DispatchCase(std::mt19937 rng, int64_t I_) : I(I_), g(rng), L(make_layer(g, E, H, I)), x(test::gaussian(g, M * H)) {
    ids.resize(size_t(M * k));
    for (int64_t m = 0; m < M; ++m) ids[m * k] = int32_t(m % E), ids[m * k + 1] = int32_t((m * 3 + 1) % E);
    tw = test::gaussian(g, M * k);
  }
  std::vector<float> run(Scheme s, int64_t group, const KernelDesc** kernel, int64_t b13 = 0, int64_t b2 = 0) {
    PackedExperts w13 = quantize_experts(L.w13.data(), E, 2 * I, H, s, group, 32, 64);
    PackedExperts w2 = quantize_experts(L.w2.data(), E, H, I, s, group, 32, 64);
    set_act_block(w13, b13), set_act_block(w2, b2);
    *kernel = w13.kernel;
    std::vector<float> out(size_t(M * H));
    FusedMoeArgs a;
    a.x = x.data(), a.M = M, a.H = H, a.w13 = &w13, a.w2 = &w2, a.topk_weights = tw.data();
    a.topk_ids = ids.data(), a.k = k, a.out = out.data();
    fused_experts(a);
    return out;
  }
  // The reference kernels' result of the same call (the level forced to reference meanwhile).
  std::vector<double> reference(Scheme s, int64_t group, int64_t b13 = 0, int64_t b2 = 0) {
    const std::string level = forced_isa();
    const KernelDesc* ref = nullptr;
    force_isa("reference");
    const std::vector<float> want = run(s, group, &ref, b13, b2);
    force_isa(level);
    EXPECT_NE(std::string(ref->name).find("reference"), std::string::npos);
    return std::vector<double>(want.begin(), want.end());
  }
};

// End to end at a shrunk Qwen3-like shape (H=256, I=96, E=8, k=2): the kernels dispatch picks for
// the running ISA level (MOE_CPU_ISA) against the reference kernels, for every scheme; with
// MOE_CPU_EXPECT_ISA set, dispatch must have picked that ISA's kernel.
TEST(FusedExperts, DispatchedPathMatchesReferenceForEveryScheme) {
  DispatchCase d(test::rng_for_test(), 96);
  for (Scheme s : {Scheme::kInt4W4A8, Scheme::kInt8W8A8, Scheme::kFp8W8A16, Scheme::kBf16, Scheme::kInt4W4A16, Scheme::kInt8W8A16}) {
    const int64_t group = weight_scheme(s) == Scheme::kInt4W4A8 ? 32 : -1;
    const KernelDesc* kd = nullptr;
    const std::vector<float> got = d.run(s, group, &kd);
    const std::string kernel = kd->name, precision = kernel.substr(0, kernel.find('_'));
    if (std::getenv("MOE_CPU_EXPECT_ISA"))
      EXPECT_EQ(std::string(kd->isa), expected_isa(precision.c_str())) << "dispatch chose " << kernel << " for " << precision;
    RecordProperty("kernel_" + precision, kernel);
    EXPECT_LT(test::rel_max_err(got, d.reference(s, group)), is_a16_scheme(s) ? 1e-4 : is_int_scheme(s) ? 2e-2 : 5e-3) << kernel;
  }
}

// The same with A8 activation blocks (B shorter than the groups, spanning them, per channel), w13 and w2 with
// different blocks: the dispatched kernels against the reference kernels (both quantize per block).
TEST(FusedExperts, DispatchedPathMatchesReferenceWithActivationBlocks) {
  DispatchCase d(test::rng_for_test(), 128);
  struct Case { Scheme s; int64_t group, b13, b2; };
  for (const Case c : {Case{Scheme::kInt4W4A8, 32, 32, 32}, Case{Scheme::kInt4W4A8, 128, 32, 64}, Case{Scheme::kInt4W4A8, 32, 256, 128},
                       Case{Scheme::kInt8W8A8, -1, 64, 32}, Case{Scheme::kInt8W8A8, 32, 32, 128}}) {
    SCOPED_TRACE(std::string(scheme_name(c.s)) + " g" + std::to_string(c.group) + " B " + std::to_string(c.b13) + "/" + std::to_string(c.b2));
    const KernelDesc* kd = nullptr;
    const std::vector<float> got = d.run(c.s, c.group, &kd, c.b13, c.b2);
    EXPECT_LT(test::rel_max_err(got, d.reference(c.s, c.group, c.b13, c.b2)), 2e-2) << kd->name;
  }
}

}  // namespace
}  // namespace moe_cpu

namespace moe_cpu {
namespace {

// silu_mul on every ISA word this CPU has gives the portable word's bits (kernels/silu_mul.h), and those are
// within 3e-7 (relative) of the double formula for |g| <= 80 (beyond, e^-g is clamped: docs/numerics.md); NaN stays NaN.
TEST(Activations, SiluMulSameBitsOnEveryWord) {
  std::mt19937 rng(test::rng_for_test());
  std::normal_distribution<float> nd(0.f, 12.f);
  std::vector<float> g = {0.f, -0.f, 1e-30f, -1e-30f, 1e-40f, 88.7f, 88.71f, -88.7f, -88.71f, 87.3f, -87.3f, -87.31f,
                          100.f, -100.f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN, 0.5f, -0.5f, 20.f, -20.f};
  while (g.size() < 4099) g.push_back(nd(rng));
  std::vector<float> u(g.size()), want(g.size()), got(g.size());
  for (float& x : u) x = nd(rng);
  u[0] = 1.f;
  const int64_t n = int64_t(g.size());
  kernels::portable::silu_mul(g.data(), u.data(), n, want.data());
  for (int64_t i = 0; i < n; ++i) {
    const double s = double(g[i]) / (1 + std::exp(-double(g[i]))) * double(u[i]);
    if (std::isnan(g[i])) EXPECT_TRUE(std::isnan(want[i]));
    else if (std::abs(g[i]) <= 80.f) EXPECT_NEAR(want[i], s, 3e-7 * std::abs(s) + 1e-37) << "g " << g[i] << " u " << u[i];
  }
#if defined(__x86_64__)
  using Fn = void (*)(const float*, const float*, int64_t, float*);
  const std::pair<uint64_t, Fn> words[] = {{kFeatAvx2, kernels::avx2::silu_mul}, {kFeatAvx512, kernels::avx512::silu_mul}};
  for (const auto& [feat, fn] : words) {
    if (!(detected_features() & feat)) continue;
    for (const int64_t len : {n, int64_t(1), int64_t(15), int64_t(17), int64_t(33)}) {  // vector bodies and tails
      std::fill(got.begin(), got.end(), 7.f);
      fn(g.data(), u.data(), len, got.data());
      for (int64_t i = 0; i < len; ++i)
        ASSERT_EQ(float_to_bits(got[i]), float_to_bits(want[i])) << "word " << feat << " g " << g[i] << " u " << u[i];
      if (len < n) EXPECT_EQ(got[size_t(len)], 7.f);
    }
  }
#endif
}

TEST(Activations, SiluMatchesTheFormula) {
  for (float g = -30.f; g <= 30.f; g += 0.01f) {
    const double want = g / (1 + std::exp(-double(g)));
    EXPECT_NEAR(silu(g), want, 4e-7 * std::max(1.0, std::abs(want))) << g;
  }
}

}  // namespace
}  // namespace moe_cpu
