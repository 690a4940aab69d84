// test_weight_forms.cpp — the int kernels on the checkpoint weight forms: int4 codebooks (IQ4_NL,
// MXFP4 e2m1 x 2, unsigned 0..15, IQ2 / IQ3_XXS / IQ1 values, the int8 extremes), float group offsets (mins) on
// int4 and int8, int8 with group 16 (GGUF Q6_K, Q3_K, Q2_K with mins), int4 with group 16 (IQ2_XS, IQ2_S, IQ1_M,
// ik's IQ2_K / IQ3_K) and in groups of 256 (TQ), against a direct double computation of the dequantized math.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "moe/act_buffer.h"
#include "moe/int_forms.h"
#include "moe/split_codes.h"
#include "moe/qword_panels.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/packed_experts.h"
#include "test_util.h"

namespace moe_cpu {
namespace {
using test::int_kernels;

constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr int8_t kUnsigned[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
constexpr int8_t kIq2[16] = {-43, -25, -8, 8, 25, 43};  // IQ2_XXS's grid values, signed (the rest unused)
constexpr int8_t kIq3xxs[16] = {-62, -52, -44, -36, -28, -20, -12, -4, 4, 12, 20, 28, 36, 44, 52, 62};
constexpr int8_t kIq1[16] = {-9, -7, -1, 1, 7, 9};  // IQ1_S: 8 (grid + delta)
constexpr int8_t kExtremes[16] = {-128, 127, -128, 127, -1, 1, 0, 0, -128, 127, 5, -5, 64, -64, 100, -100};
constexpr int8_t kIq2k[16] = {-31, -13, 1, 17, -26, -8, 8, 24};  // ik's IQ2_K values (both halves)
// Codebooks at the int16 sums' top, activations at +-127: kTop32's code_table bytes (0, 64) in pairs of vpmaddubsw
// outputs on qword panels (kQwordTable), kTop64's |values| in pairs of signed ones (kQwordSigned; signed_pair_sum):
// most lanes reach 4 * 64 * 127 = 32512
constexpr int8_t kTop32[16] = {-32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32};
constexpr int8_t kTop64[16] = {-64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64};

struct FormCase {
  const char* label;
  bool int4;
  const int8_t* codebook;  // int4: nullptr = signed q in [-8, 7]
  bool mins;
  int64_t rows, N, K, group;
  bool kquant = false;  // mins = dmin * (6-bit m) per run of 8 groups: kernels with int_mins take them as integers
  // scales = d * (6-bit sc, or sc - 32 without mins: IQ4_XS) per run of 8 groups: int4 kernels with
  // int_scales take them as integers
  bool kscales = false;
  int lo8 = -128, hi8 = 127;  // int8: the codes' range (narrow ones: split 2- to 6-bit codes on kernels that take them)
  bool top = false;           // int8: every code at hi8 but one at lo8, activations +-127 (the largest int16 sums of split codes)
  bool q2k = false;           // scales and mins 4-bit integers times one d per 16 groups (GGUF Q2_K's 256): int_nibbles
};
const FormCase kForms[] = {
    {"Iq4nl_M1", true, kIq4nl, false, 1, 40, 256, 32},
    {"Iq4nl_M7", true, kIq4nl, false, 7, 33, 128, 32},
    {"Iq4nl_Mins_M13", true, kIq4nl, true, 13, 70, 192, 64},
    {"Mxfp4_M1", true, kMxfp4, false, 1, 100, 256, 32},
    {"Mxfp4_M5", true, kMxfp4, false, 5, 48, 96, 32},
    {"Mxfp4_PerChannel", true, kMxfp4, false, 3, 17, 160, -1},
    {"Unsigned_Mins_M1", true, kUnsigned, true, 1, 64, 256, 32},  // Q4_K, Q4_1
    {"Unsigned_Mins_M9", true, kUnsigned, true, 9, 50, 128, 32},
    {"Extremes_M6", true, kExtremes, false, 6, 32, 512, 128},
    {"Signed_Mins_M4", true, nullptr, true, 4, 20, 64, 32},
    {"Int8_G16_M1", false, nullptr, false, 1, 64, 256, 16},          // Q6_K
    {"Int8_G16_M11", false, nullptr, false, 11, 37, 272, 16},
    {"Int8_G16_Mins_M3", false, nullptr, true, 3, 40, 64, 16},
    {"Int8_G32_Mins_M1", false, nullptr, true, 1, 80, 256, 32},       // Q5_K, Q5_1
    {"Int8_G32_Mins_M8", false, nullptr, true, 8, 18, 96, 32},
    {"Unsigned_KMins_M1", true, kUnsigned, true, 1, 80, 512, 32, true},   // Q4_K
    {"Unsigned_KMins_M7", true, kUnsigned, true, 7, 70, 288, 32, true},   // 9 groups: a short run, a padded pair
    {"Int8_G32_KMins_M1", false, nullptr, true, 1, 64, 256, 32, true},    // Q5_K
    {"Int8_G32_KMins_M13", false, nullptr, true, 13, 40, 320, 32, true},
    {"Unsigned_KScales_KMins_M1", true, kUnsigned, true, 1, 80, 512, 32, true, true},  // Q4_K as files hold it
    {"Unsigned_KScales_KMins_M7", true, kUnsigned, true, 7, 70, 288, 32, true, true},  // 9 groups: a short run
    {"Unsigned_KScales_KMins_M13", true, kUnsigned, true, 13, 40, 256, 32, true, true},  // two row tiles: widened in each
    {"Unsigned_KScales_KMins_M20", true, kUnsigned, true, 20, 40, 256, 32, true, true},  // three: a scratch per block
    {"Iq4nl_KScales_M1", true, kIq4nl, false, 1, 48, 256, 32, false, true},            // IQ4_XS
    {"Iq4nl_KScales_M6", true, kIq4nl, false, 6, 40, 320, 32, false, true},            // 10 groups
    {"Int8_6bit_G16_M1", false, nullptr, false, 1, 64, 256, 16, false, false, -32, 31},          // Q6_K codes
    {"Int8_6bit_G16_M11", false, nullptr, false, 11, 37, 272, 16, false, false, -32, 31},
    {"Int8_5bit_G32_Mins_M1", false, nullptr, true, 1, 80, 256, 32, false, false, 0, 31},        // Q5_K codes
    {"Int8_5bit_G32_KMins_M9", false, nullptr, true, 9, 37, 320, 32, true, false, 0, 31},
    {"Int8_5bit_G32_KMins_M1", false, nullptr, true, 1, 40, 320, 32, true, false, 0, 31},  // split decode, int mins
    {"Int8_5bit_G32_KScales_KMins_M1", false, nullptr, true, 1, 64, 512, 32, true, true, 0, 31},  // Q5_K as files hold it
    {"Int8_5bit_G32_KScales_KMins_M8", false, nullptr, true, 8, 37, 512, 32, true, true, 0, 31},
    {"Int8_5bit_G32_KMins_M20", false, nullptr, true, 20, 40, 256, 32, true, false, 0, 31},  // mins widened per block
    {"Int8_6bit_G32_KScales_M5", false, nullptr, false, 5, 40, 512, 32, false, true, -20, 43},
    {"Int8_6bit_G16_Top_M6", false, nullptr, false, 6, 32, 256, 16, false, false, -32, 31, true},
    {"Int8_5bit_G32_Top_M1", false, nullptr, false, 1, 32, 256, 32, false, false, 0, 31, true},
    {"Int8_5bit_G32_Mins_M13", false, nullptr, true, 13, 40, 320, 32, false, false, 0, 31},      // int8 row tiles
    {"Int8_6bit_G16_KScales_M14", false, nullptr, false, 14, 40, 256, 16, false, true, -32, 31},
    {"Int8_6bit_G16_Top_M12", false, nullptr, false, 12, 48, 128, 16, false, false, -32, 31, true},
    {"Int8_2bit_G16_KScales_KMins_M1", false, nullptr, true, 1, 48, 256, 16, true, true, 0, 3},   // Q2_K
    {"Int8_2bit_G16_KScales_KMins_M9", false, nullptr, true, 9, 40, 512, 16, true, true, 0, 3},
    {"Int8_2bit_G16_Q2K_M1", false, nullptr, true, 1, 48, 512, 16, true, true, 0, 3, false, true},  // Q2_K as files hold it
    {"Int8_2bit_G16_Q2K_M9", false, nullptr, true, 9, 40, 320, 16, true, true, 0, 3, false, true},  // 20 groups: a short span
    {"Int8_2bit_G16_Q2K_Top_M6", false, nullptr, true, 6, 32, 512, 16, true, true, 0, 3, true, true},
    {"Int8_3bit_G16_KScales_M6", false, nullptr, false, 6, 40, 256, 16, false, true, -4, 3},       // Q3_K
    {"Int8_3bit_G32_M9", false, nullptr, false, 9, 40, 256, 32, false, false, -4, 3},
    {"Int8_3bit_G16_M1", false, nullptr, false, 1, 48, 256, 16, false, false, -4, 3},            // 3-bit decode
    {"Int8_3bit_G16_KScales_M1", false, nullptr, false, 1, 40, 272, 16, false, true, -4, 3},     // 34 steps: a half vector
    {"Int8_3bit_G16_Top_M1", false, nullptr, false, 1, 32, 272, 16, false, false, -4, 3, true},
    {"Int8_3bit_G16_Top_M7", false, nullptr, false, 7, 32, 272, 16, false, false, -4, 3, true},
    {"Int8_2bit_G32_Mins_M1", false, nullptr, true, 1, 40, 256, 32, false, false, 0, 3},
    {"Int8_2bit_G16_Top_M7", false, nullptr, false, 7, 32, 256, 16, false, false, 0, 3, true},
    {"Int8_4bit_G16_Top_M1", false, nullptr, false, 1, 32, 256, 16, false, false, -8, 7, true},
    {"Signed_G256_M5", true, nullptr, false, 5, 40, 512, 256},                                      // TQ1_0, TQ2_0
    {"Iq2_M3", true, kIq2, false, 3, 40, 256, 32},                                                  // IQ2_XXS
    {"Iq3xxs_M1", true, kIq3xxs, false, 1, 48, 256, 32},                                            // IQ3_XXS
    {"Iq1_M7", true, kIq1, false, 7, 40, 256, 32},                                                  // IQ1_S
    {"Iq2_G16_M1", true, kIq2, false, 1, 40, 256, 16},                                              // IQ2_XS, IQ2_S
    {"Iq2_G16_M9", true, kIq2, false, 9, 37, 272, 16},
    {"Iq2_G16_KScales_M1", true, kIq2, false, 1, 48, 256, 16, false, true},                         // as files hold it
    {"Iq2_G16_KScales_M13", true, kIq2, false, 13, 40, 384, 16, false, true},
    {"Iq1_G16_KScales_M6", true, kIq1, false, 6, 40, 256, 16, false, true},                         // IQ1_M
    {"Iq3xxs_G16_M20", true, kIq3xxs, false, 20, 40, 256, 16},                                      // ik's IQ3_K
    {"Iq2k_G16_M11", true, kIq2k, false, 11, 40, 256, 16},                                          // ik's IQ2_K
    {"Iq2k_G32_M9", true, kIq2k, false, 9, 40, 256, 32},                                            // ik's IQ2_KS
    {"Top32_G16_M5", true, kTop32, false, 5, 32, 256, 16},                                          // int16 sums at their top
    {"Top64_G16_M6", true, kTop64, false, 6, 32, 256, 16},
    {"Top64_G32_M7", true, kTop64, false, 7, 32, 256, 32},
    {"Signed_G16_Mins_M3", true, nullptr, true, 3, 24, 128, 16},
    {"Unsigned_G48_M2", true, kUnsigned, false, 2, 24, 96, 48},
};

class WeightFormTest : public ::testing::TestWithParam<const KernelDesc*> {};

TEST_P(WeightFormTest, MatchesDequantizedMath) {
  const KernelDesc* kd = test::runnable(GetParam());
  MOE_CPU_SKIP_UNLESS_RUNNABLE(kd);
  auto g = test::rng_for_test();
  int ran = 0;
  for (const FormCase& c : kForms) {
    if (c.int4 != (weight_scheme(kd->scheme) == Scheme::kInt4W4A8)) continue;
    const bool a16 = is_a16_scheme(kd->scheme);
    SCOPED_TRACE(c.label);
    const int64_t E = 2, e = 1, N = c.N, K = c.K, R = c.rows;
    if (c.int4 && a16 && c.group > 0 && c.group % 32) {  // int4 A16 takes groups of 32 only: a clear refusal
      const std::vector<int8_t> q0(size_t(N * K), 0);
      const std::vector<float> s0(size_t(N * K / c.group), 1.f);
      EXPECT_THROW(pack_int4(q0.data(), 1, N, K, s0.data(), c.group, nullptr, nullptr, nullptr, true), ValueError);
      continue;
    }
    const int64_t gl = c.group > 0 ? c.group : K, G = K / gl;
    const bool extremes = c.codebook == kExtremes || c.codebook == kTop32 || c.codebook == kTop64 || c.top;
    // codes: int4 indices (or signed q), int8 values; the weight value v(code)
    auto q = c.int4 ? (c.codebook ? test::ints(g, size_t(E * N * K), 0, 15) : test::ints(g, size_t(E * N * K), -8, 7))
                    : test::ints(g, size_t(E * N * K), c.lo8, c.hi8);
    if (c.top) std::fill(q.begin(), q.end(), int8_t(c.hi8)), q[0] = int8_t(c.lo8);  // one low code keeps the span
    auto value = [&](int64_t i) { return c.codebook ? int(c.codebook[uint8_t(q[size_t(i)])]) : int(q[size_t(i)]); };
    auto s = test::gaussian(g, size_t(E * N * G));
    auto mn = test::gaussian(g, size_t(E * N * G), 0.5f);
    if (c.kquant) {  // one dmin per (row, run of 8 groups), times 6-bit integers; some runs all zero
      const auto dmin = test::gaussian(g, size_t(E * N * G), 0.01f);
      const auto m6 = test::ints(g, size_t(E * N * G), 0, 63);
      for (int64_t i = 0; i < E * N * G; ++i) {
        const int64_t run = (i / G) * G + (i % G) / (c.q2k ? 16 : 8) * (c.q2k ? 16 : 8);
        int ex = 0;  // dmin an fp16 value (11 significant bits, >= 2^-14), as a K-quant's: the products are exact
        const float mant = std::frexp(float(dmin[size_t(run)]), &ex);
        const float d11 = std::ldexp(std::round(std::ldexp(mant, 11)), std::max(ex, -13) - 11);
        mn[size_t(i)] = (run / 8) % 5 == 3 ? 0.f : d11 * float(c.q2k ? m6[size_t(i)] % 16 : m6[size_t(i)]);
      }
    }
    if (c.kscales) {  // one d per (row, run of 8 groups), an fp16 value (11 significant bits, >= 2^-14), times small integers
      const auto d = test::gaussian(g, size_t(E * N * G), 0.1f);
      const auto sc = c.q2k ? test::ints(g, size_t(E * N * G), 0, 15)
                      : c.mins ? test::ints(g, size_t(E * N * G), 0, 63) : test::ints(g, size_t(E * N * G), -32, 31);
      for (int64_t i = 0; i < E * N * G; ++i) {
        const int64_t run = (i / G) * G + (i % G) / (c.q2k ? 16 : 8) * (c.q2k ? 16 : 8);
        int ex = 0;
        const float mant = std::frexp(float(d[size_t(run)]), &ex);
        s[size_t(i)] = std::ldexp(std::round(std::ldexp(mant, 11)), std::max(ex, -13) - 11) * float(sc[size_t(i)]);
      }
    }
    if (extremes && !c.q2k) std::fill(s.begin(), s.end(), 1.0f);
    if (c.top && c.q2k)  // the largest 4-bit scales and mins (d, dmin 1: each span's first group 1, the others 15)
      for (int64_t i = 0; i < E * N * G; ++i) s[size_t(i)] = mn[size_t(i)] = (i % G) % 16 ? 15.f : 1.f;
    PackedExperts p = c.int4 ? pack_int4(q.data(), E, N, K, s.data(), c.group, nullptr, c.codebook, c.mins ? mn.data() : nullptr, a16)
                             : pack_int8(q.data(), E, N, K, s.data(), c.group, c.mins ? mn.data() : nullptr, a16);
    if (kd->supports && !kd->supports(p)) continue;
    set_kernel(p, kd);
    if (c.kquant) EXPECT_EQ(p.imin_groups, kd->int_mins || p.split_bits ? 8 : 0) << "integer mins";
    if (c.kscales) EXPECT_EQ(p.iscale_groups, kd->int_scales ? 8 : 0) << "integer scales";
    if (c.q2k) EXPECT_EQ(p.int_nibbles, kd->int_nibbles) << "4-bit integer forms";
    if (extremes && !c.q2k && !p.iscale_groups) EXPECT_EQ(p.half_scales, kd->half_scales) << "fp16 scales (all 1)";
    const int span = c.hi8 - c.lo8;
    if (!c.int4 && c.lo8 > -128)
      EXPECT_EQ(p.split_bits, !kd->split_codes ? 0 : span < 4 ? 2 : span < 8 && kd->split3 ? 3 : span < 16 ? 4 : span < 32 && c.group == 32 ? 5 : 6)
          << "split codes";
    if (c.int4) {  // plain or |codebook| codes in groups of 32 along K, |codebook| ones in groups of 16: qword panels
      const bool signed_cb = p.code_shuffle && code_table_top(p) > 31;  // where the kernel takes them
      const bool q32 = c.group == 32 && K % 32 == 0 && (!p.code_shuffle || signed_cb), q16 = c.group == 16 && signed_cb;
      EXPECT_EQ(p.qword_panels, kd->qword_panels && !a16 && (q32 || q16)) << "qword panels";
    }
    if (p.qword_panels) {  // the codes read back through the reordered panels (unpack, files)
      std::vector<uint16_t> row(static_cast<size_t>(K));
      for (int64_t e = 0; e < E; e += E - 1)
        for (int64_t n = 0; n < N; n += 7) {
          p.code_row(e, n, row.data());
          for (int64_t k = 0; k < K; ++k) {
            const int8_t v = q[size_t((e * N + n) * K + k)];
            ASSERT_EQ(int(row[size_t(k)]), c.codebook ? int(uint8_t(v)) : v + 8) << "code (" << e << ", " << n << ", " << k << ")";
          }
        }
    }
    ++ran;
    // activations: random, or +-127 of one sign per row (the extremes of every int16 / int32 sum)
    auto aq = test::ints(g, size_t(R * K), -127, 127);
    if (extremes)
      for (int64_t i = 0; i < R * K; ++i) aq[size_t(i)] = (i / K) % 2 ? int8_t(-127) : int8_t(127);
    auto as = test::gaussian(g, size_t(R));
    test::Acts acts;
    const int64_t Kp = p.padded_k();
    acts.q.assign(size_t(R * Kp), 0);
    acts.asum.assign(size_t(R * G), 0);
    acts.s = as;
    acts.idx.resize(size_t(R));
    for (int64_t r = 0; r < R; ++r) {
      acts.idx[size_t(r)] = int32_t(r);
      for (int64_t k = 0; k < K; ++k) acts.q[size_t(r * Kp + k)] = aq[size_t(r * K + k)], acts.asum[size_t(r * G + k / gl)] += aq[size_t(r * K + k)];
    }
    std::vector<double> want(size_t(R * N), 0.0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t gi = 0; gi < G; ++gi) {
          int64_t dot = 0, asum = 0;
          for (int64_t k = gi * gl; k < (gi + 1) * gl; ++k) {
            dot += int64_t(aq[size_t(r * K + k)]) * value((e * N + n) * K + k);
            asum += aq[size_t(r * K + k)];
          }
          const size_t si = size_t((e * N + n) * G + gi);
          want[size_t(r * N + n)] += (double(dot) * s[si] - (c.mins ? double(mn[si]) * double(asum) : 0.0)) * as[size_t(r)];
        }
    if (a16 && extremes) {  // A16: int16 codes at +-32766
      acts.a16_mul = 258;
      for (double& v : want) v *= 258;
    }
    std::vector<float> got(size_t(R * N), NAN);
    kd->gemm(p, e, 0, p.num_blocks(), acts.view(p, R), got.data(), N);
    if (const KernelDesc* twin = test::amx_twin(kd)) {  // the per-expert choice between them changes no bit
      std::vector<float> ref(got.size(), NAN);
      twin->gemm(p, e, 0, p.num_blocks(), acts.view(p, R), ref.data(), N);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(float_to_bits(got[i]), float_to_bits(ref[i])) << kd->name << " vs " << twin->name << " at " << i;
    }
    // AVX-512 (a kernel that takes integer mins anyway): split codes give the int8 panels' bits, in decode and in
    // the row tiles that widen them (not Q2_K's 4-bit forms, which only split codes take: their d per 16 groups rounds
    // the terms apart from the int8 forms' per 8; against `want` above)
    if (p.split_bits && kd->int_mins && !p.int_nibbles) {
      join_split_codes(p);  // (the unpack check below reads the joined panels)
      std::vector<float> ji(got.size(), NAN);
      kd->gemm(p, e, 0, p.num_blocks(), acts.view(p, R), ji.data(), N);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(float_to_bits(got[i]), float_to_bits(ji[i])) << kd->name << " split vs int8 panels at " << i;
    }
    // AVX2: split codes widen integer mins to the float mins: the same bits (with integer scales too, the AVX2 runs
    // subtract them as their run term instead: kernels/int_avx2_runs.h, within rounding, checked above)
    if (p.split_bits && p.imin_groups && !p.iscale_groups && !kd->int_mins) {
      p.mins = float_mins(p), p.imins = AlignedBuffer(), p.dmins = AlignedBuffer(), p.imin_groups = 0;
      std::vector<float> fl(got.size(), NAN);
      kd->gemm(p, e, 0, p.num_blocks(), acts.view(p, R), fl.data(), N);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(float_to_bits(got[i]), float_to_bits(fl[i])) << kd->name << " integer vs float mins at " << i;
    }
    if (extremes && !a16) {  // integer sums at their largest: exact (A16's sums outgrow fp32's 24 bits: to 1e-6)
      for (int64_t i = 0; i < R * N; ++i) ASSERT_EQ(double(got[size_t(i)]), double(float(want[size_t(i)]))) << kd->name << " at " << i;
    } else {
      EXPECT_LT(test::rel_max_err(got, want), extremes ? 1e-6 : 1e-5) << kd->name;
    }
    // the dequantized weights are the same math
    std::vector<float> deq(size_t(E * N * K));
    unpack(p, deq.data());
    for (int64_t i = 0; i < E * N * K; i += 7) {
      const size_t si = size_t((i / K) * G + (i % K) / gl);
      const float want_w = float(value(i)) * s[si] - (c.mins ? mn[si] : 0.f);
      ASSERT_EQ(deq[size_t(i)], want_w) << "unpack at " << i;
    }
  }
  EXPECT_GE(ran, 4) << kd->name << " supports too few of the cases";
}

// A8 activation blocks (one int8 scale per B channels of a row, ActBuffer::set_row) on every form: pieces shorter
// than a group (B < group), blocks spanning groups (B > group), per channel, integer mins dropped; against a double
// computation from the buffer's codes and block scales recomputed here (amax / 127 of each block).
TEST_P(WeightFormTest, ActivationBlocksMatchDequantizedMath) {
  const KernelDesc* kd = test::runnable(GetParam());
  MOE_CPU_SKIP_UNLESS_RUNNABLE(kd);
  auto g = test::rng_for_test();
  if (is_a16_scheme(kd->scheme)) {  // A16 activations are per token: a block is refused, naming the scheme
    const std::vector<int8_t> q(64 * 64, 1);
    const std::vector<float> s(64 * 2, 1.f);
    PackedExperts p = weight_scheme(kd->scheme) == Scheme::kInt4W4A8 ? pack_int4(q.data(), 1, 64, 64, s.data(), 32, nullptr, nullptr, nullptr, true)
                                                                      : pack_int8(q.data(), 1, 64, 64, s.data(), 32, nullptr, true);
    EXPECT_THROW(set_act_block(p, 32), ValueError);
    EXPECT_EQ(p.act_block, 0);
    return;
  }
  int ran = 0;
  for (const FormCase& c : kForms) {
    if (c.int4 != (weight_scheme(kd->scheme) == Scheme::kInt4W4A8) || c.codebook == kExtremes) continue;
    for (int64_t B : {32, 64, 128, 256}) {
      const int64_t E = 2, e = 1, N = c.N, K = c.K, R = c.rows;
      const int64_t gl = c.group > 0 ? c.group : K, G = K / gl;
      if (K % B || (gl % B && B % gl)) continue;
      SCOPED_TRACE(std::string(c.label) + " B=" + std::to_string(B));
      auto q = c.int4 ? (c.codebook ? test::ints(g, size_t(E * N * K), 0, 15) : test::ints(g, size_t(E * N * K), -8, 7))
                      : test::ints(g, size_t(E * N * K), c.lo8, c.hi8);
    if (c.top) std::fill(q.begin(), q.end(), int8_t(c.hi8)), q[0] = int8_t(c.lo8);  // one low code keeps the span
      auto value = [&](int64_t i) { return c.codebook ? int(c.codebook[uint8_t(q[size_t(i)])]) : int(q[size_t(i)]); };
      auto s = test::gaussian(g, size_t(E * N * G));
      auto mn = test::gaussian(g, size_t(E * N * G), 0.5f);
      if (c.kquant) {  // dmin (an fp16 value) per run of 8 groups times 6-bit integers, as in the test above
        const auto dmin = test::gaussian(g, size_t(E * N * G), 0.01f);
        const auto m6 = test::ints(g, size_t(E * N * G), 0, 63);
        for (int64_t i = 0; i < E * N * G; ++i) {
          int ex = 0;
          const float mant = std::frexp(float(dmin[size_t((i / G) * G + (i % G) / 8 * 8)]), &ex);
          mn[size_t(i)] = std::ldexp(std::round(std::ldexp(mant, 11)), std::max(ex, -13) - 11) * float(m6[size_t(i)]);
        }
      }
      if (c.kscales) {  // d (an fp16 value) per run of 8 groups times small integers, as in the test above
        const auto d = test::gaussian(g, size_t(E * N * G), 0.1f);
        const auto sc = c.mins ? test::ints(g, size_t(E * N * G), 0, 63) : test::ints(g, size_t(E * N * G), -32, 31);
        for (int64_t i = 0; i < E * N * G; ++i) {
          int ex = 0;
          const float mant = std::frexp(float(d[size_t((i / G) * G + (i % G) / 8 * 8)]), &ex);
          s[size_t(i)] = std::ldexp(std::round(std::ldexp(mant, 11)), std::max(ex, -13) - 11) * float(sc[size_t(i)]);
        }
      }
      PackedExperts p = c.int4 ? pack_int4(q.data(), E, N, K, s.data(), c.group, nullptr, c.codebook, c.mins ? mn.data() : nullptr)
                               : pack_int8(q.data(), E, N, K, s.data(), c.group, c.mins ? mn.data() : nullptr);
      if (kd->supports && !kd->supports(p)) continue;
      set_act_block(p, B);
      set_kernel(p, kd);
      // integer mins stay: per run times its block scale (B = 256 over a K-quant's 8 x 32), or as fp32 against
      // the groups' fp32 code sums (shorter blocks)
      EXPECT_EQ(p.imin_groups, c.kquant && (kd->int_mins || p.split_bits) ? 8 : 0) << "integer mins";
      ++ran;
      // activations whose blocks differ in range by 2^10, so a per-row scale would lose the small blocks
      auto x = test::gaussian(g, size_t(R * K));
      for (int64_t i = 0; i < R * K; ++i) x[size_t(i)] *= std::ldexp(1.f, int((i % K) / B % 11) - 5);
      ActBuffer ab;
      ab.reset(p, R);
      std::vector<int32_t> idx(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) idx[size_t(r)] = int32_t(r), ab.set_row(r, x.data() + r * K, "x");
      std::vector<double> want(size_t(R * N), 0.0);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t k0 = 0; k0 < K; k0 += B) {
          float amax = 0.f;
          for (int64_t k = k0; k < k0 + B; ++k) amax = std::max(amax, std::fabs(x[size_t(r * K + k)]));
          const double sb = amax == 0.f ? 1.0 : double(amax / 127.f);
          for (int64_t n = 0; n < N; ++n) {
            double acc = 0.0;
            for (int64_t k = k0; k < k0 + B; ++k) {
              const size_t si = size_t((e * N + n) * G + k / gl);
              const double wv = double(value((e * N + n) * K + k)) * s[si] - (c.mins ? double(mn[si]) : 0.0);
              acc += double(ab.q[size_t(r * ab.Kp + k)]) * wv;
            }
            want[size_t(r * N + n)] += acc * sb;
          }
        }
      std::vector<float> got(size_t(R * N), NAN);
      kd->gemm(p, e, 0, p.num_blocks(), ab.view(idx.data(), R), got.data(), N);
      if (const KernelDesc* twin = test::amx_twin(kd)) {  // the per-expert choice between them changes no bit
        std::vector<float> ref(got.size(), NAN);
        twin->gemm(p, e, 0, p.num_blocks(), ab.view(idx.data(), R), ref.data(), N);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(float_to_bits(got[i]), float_to_bits(ref[i])) << kd->name << " vs " << twin->name << " at " << i;
      }
      EXPECT_LT(test::rel_max_err(got, want), 1e-5) << kd->name;
      // AVX2's run tiles (integer scales, blocks of whole pairs of groups): a row alone (decode) has its tile's bits
      if (std::string(kd->name).find("_avx2_") != std::string::npos && p.iscale_groups && run_block_groups(p) != 0)
        for (int64_t r = 0; r < R; r += std::max<int64_t>(1, R - 1)) {
          std::vector<float> one(size_t(N), NAN);
          kd->gemm(p, e, 0, p.num_blocks(), ab.view(idx.data() + r, 1), one.data(), N);
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(float_to_bits(one[size_t(n)]), float_to_bits(got[size_t(r * N + n)])) << kd->name << " row " << r << " alone, column " << n;
        }
    }
  }
  EXPECT_GE(ran, 4) << kd->name << " supports too few of the cases";
}

INSTANTIATE_TEST_SUITE_P(IntKernels, WeightFormTest, ::testing::ValuesIn(int_kernels()),
                         [](const auto& info) { return std::string(info.param->name); });

// The 4-bit integer forms leave for the floats when the kernel does not read them and come back when it does:
// the same scale() / min() floats and the file's bytes (84 per 256 weights) each time.
TEST(WeightForms, Q2kNibblesFollowTheKernel) {
  const KernelDesc* nib = nullptr;
  for (const KernelDesc* kd : all_kernels())
    if (kd->scheme == Scheme::kInt8W8A8 && (kd->features & active_features()) == kd->features && kd->int_nibbles && !nib) nib = kd;
  ASSERT_NE(nib, nullptr) << "the reference takes the 4-bit forms";
  KernelDesc floats = *nib;  // the same kernel, reading fp32 scales and mins and int8 panels
  floats.int_mins = floats.int_scales = floats.half_scales = floats.split_codes = floats.split3 = floats.int_nibbles = false;
  const KernelDesc* other = &floats;
  const int64_t E = 2, N = 32, K = 512, G = K / 16;
  auto g = test::rng_for_test();
  const auto q = test::ints(g, size_t(E * N * K), 0, 3), sc = test::ints(g, size_t(E * N * G), 0, 15), m = test::ints(g, size_t(E * N * G), 0, 15);
  std::vector<float> s(sc.size()), mn(m.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = float(sc[i]) * 0x1p-9f * float(1 + (i / 16) % 3), mn[i] = float(m[i]) * 0x1p-10f;
  PackedExperts p = pack_int8(q.data(), E, N, K, s.data(), 16, mn.data(), false);
  for (const KernelDesc* kd : {nib, other, nib}) {
    set_kernel(p, kd);
    SCOPED_TRACE(kd->name);
    EXPECT_EQ(p.int_nibbles, kd == nib);
    if (kd == nib) EXPECT_EQ(p.nbytes(), size_t(E * N * K / 256 * 84));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t gi = 0; gi < G; ++gi) {
          const size_t i = size_t((e * N + n) * G + gi);
          ASSERT_EQ(p.scale(e, n, gi), s[i]) << e << " " << n << " " << gi;
          ASSERT_EQ(p.min(e, n, gi), mn[i]) << e << " " << n << " " << gi;
        }
  }
}

TEST(WeightForms, PackRejectsBadForms) {
  const int64_t E = 1, N = 4, K = 64;
  std::vector<int8_t> q(size_t(E * N * K), 3);
  std::vector<float> s(size_t(E * N * 2), 1.f), m(size_t(E * N * 2), 0.f);
  std::vector<uint8_t> z(size_t(E * N * 2), 8);
  EXPECT_THROW(pack_int4(q.data(), E, N, K, s.data(), 32, z.data(), kIq4nl, nullptr), ValueError);
  m[3] = NAN;
  EXPECT_THROW(pack_int4(q.data(), E, N, K, s.data(), 32, nullptr, kIq4nl, m.data()), ValueError);
  EXPECT_THROW(pack_int8(q.data(), E, N, K, s.data(), 32, m.data()), ValueError);
  q[5] = 16;  // a codebook index past 15
  EXPECT_THROW(pack_int4(q.data(), E, N, K, s.data(), 32, nullptr, kIq4nl, nullptr), ValueError);
}

TEST(WeightForms, FormNamesAndDerivedTable) {
  const int64_t E = 1, N = 4, K = 64;
  std::vector<int8_t> q(size_t(E * N * K), 3);
  std::vector<float> s(size_t(E * N * 2), 1.f), m(size_t(E * N * 2), 0.25f);
  PackedExperts a = pack_int4(q.data(), E, N, K, s.data(), 32, nullptr, kIq4nl, m.data());
  EXPECT_EQ(a.form(), "int4+codebook+mins");
  EXPECT_TRUE(a.code_shuffle);
  EXPECT_EQ(a.code_zero, 127);
  EXPECT_EQ(a.code_table[15], 113 + 127);
  PackedExperts b = pack_int4(q.data(), E, N, K, s.data(), 32, nullptr, kUnsigned, nullptr);
  EXPECT_FALSE(b.code_shuffle);  // the identity table: plain nibbles, zero point 0
  EXPECT_EQ(b.code_zero, 0);
  PackedExperts c = pack_int8(q.data(), E, N, K, s.data(), 32, m.data());
  EXPECT_EQ(c.form(), "int8+mins");
}

}  // namespace
}  // namespace moe_cpu
