// test_pack.cpp — packing round trips (exact for pre-quantized input), fp8 and bf16 conversions.
#include <gtest/gtest.h>

#include <cmath>

#include "common/numeric.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/packed_experts.h"
#include "test_util.h"

namespace moe_cpu {
namespace {

// e4m3fn decoded from its definition: (-1)^s * 2^(e-7) * (1 + m/8), subnormal 2^-6 * m/8.
double e4m3_by_definition(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8, All256CodesDecode) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_by_definition(c);
    const float got = e4m3fn_to_float(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3fn_to_float(0x7e), 448.f);
  EXPECT_EQ(e4m3fn_to_float(0x01), std::ldexp(1.f, -9));
}

TEST(Fp8, EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if (e4m3fn_is_nan(uint8_t(c))) continue;
    const float v = e4m3fn_to_float(uint8_t(c));
    const uint8_t back = float_to_e4m3fn(v);
    if (v == 0.f) EXPECT_EQ(back & 0x7f, 0) << c;
    else EXPECT_EQ(back, c) << c;
  }
}

TEST(Fp8, EncodeRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float_to_e4m3fn(1.0625f), 0x38);  // halfway 1.0 (m=0) and 1.125 (m=1): even -> 1.0
  EXPECT_EQ(float_to_e4m3fn(1.1875f), 0x3a);  // halfway 1.125 (m=1) and 1.25 (m=2): even -> 1.25
  EXPECT_EQ(float_to_e4m3fn(1.07f), 0x39);
  EXPECT_EQ(float_to_e4m3fn(1000.f), 0x7e);
  EXPECT_EQ(float_to_e4m3fn(-1000.f), 0xfe);
}

// Nearest finite code by exhaustive search, ties to the even code; saturates at 448.
uint8_t e4m3_nearest(float f) {
  const double a = std::fabs(double(f));
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(e4m3_by_definition(c) - a), db = std::fabs(e4m3_by_definition(best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return uint8_t((std::signbit(f) ? 0x80 : 0) | best);
}

TEST(Fp8, EncodeMatchesExhaustiveNearestSearch) {
  auto g = test::rng_for_test();
  std::uniform_real_distribution<float> expo(-12.f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float v = (i & 1 ? -1.f : 1.f) * std::exp2(expo(g));
    ASSERT_EQ(float_to_e4m3fn(v), e4m3_nearest(v)) << "value " << v;
  }
  for (int c = 0; c < 0x7e; ++c) {  // exact midpoints between neighbouring codes
    const float mid = float((e4m3_by_definition(c) + e4m3_by_definition(c + 1)) / 2);
    ASSERT_EQ(float_to_e4m3fn(mid), e4m3_nearest(mid)) << "midpoint after code " << c;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

struct Int4Case { int64_t E, N, K, group; bool zeros; };
class Int4RoundTrip : public ::testing::TestWithParam<Int4Case> {};

TEST_P(Int4RoundTrip, UnpackIsExact) {
  const auto c = GetParam();
  auto g = test::rng_for_test();
  const int64_t G = c.group > 0 ? c.K / c.group : 1, gl = c.group > 0 ? c.group : c.K;
  auto q = c.zeros ? test::ints(g, c.E * c.N * c.K, 0, 15) : test::ints(g, c.E * c.N * c.K, -8, 7);
  auto s = test::gaussian(g, c.E * c.N * G);
  auto z = test::ints(g, c.E * c.N * G, 0, 15);
  std::vector<uint8_t> zu(z.begin(), z.end());
  PackedExperts p = pack_int4(q.data(), c.E, c.N, c.K, s.data(), c.group, c.zeros ? zu.data() : nullptr);
  std::vector<float> out(q.size());
  unpack(p, out.data());
  for (int64_t i = 0; i < int64_t(q.size()); ++i) {
    const int64_t row = i / c.K, gi = (i % c.K) / gl;
    const int zero = c.zeros ? z[row * G + gi] : 0;
    ASSERT_EQ(out[i], float(q[i] - zero) * s[row * G + gi]) << "flat index " << i;
  }
  // Blocked layout: 16-column panels, K padded to 8; scales (and zeros) per panel column.
  const int64_t nb = (c.N + 15) / 16, kp = (c.K + 7) / 8 * 8;
  EXPECT_EQ(p.nbytes(), size_t(c.E * nb * 16 * kp / 2 + c.E * nb * G * 16 * 4 + (c.zeros ? c.E * nb * G * 16 : 0)));
}
INSTANTIATE_TEST_SUITE_P(Groups, Int4RoundTrip,
                         ::testing::Values(Int4Case{2, 5, 64, 32, false}, Int4Case{1, 7, 128, 64, true},
                                           Int4Case{3, 3, 256, 128, false}, Int4Case{2, 4, 192, 96, true},
                                           Int4Case{2, 3, 33, -1, false}, Int4Case{1, 2, 32, 32, true}));

TEST(Int8, RoundTripPerChannelAndGrouped) {
  auto g = test::rng_for_test();
  for (int64_t group : {int64_t(-1), int64_t(16), int64_t(-13)}) {  // -13: per channel, K = 13
    const int64_t E = 2, N = 3, K = group == -13 ? 13 : 48, G = group > 0 ? K / group : 1;
    group = std::max<int64_t>(group, -1);
    auto q = test::ints(g, E * N * K, -128, 127);
    auto s = test::gaussian(g, E * N * G);
    PackedExperts p = pack_int8(q.data(), E, N, K, s.data(), group);
    std::vector<float> out(q.size());
    unpack(p, out.data());
    for (int64_t i = 0; i < E * N * K; ++i)
      ASSERT_EQ(out[i], float(q[i]) * s[(i / K) * G + (i % K) / (K / G)]);
  }
}

TEST(Fp8Pack, RoundTripWithEdgeBlocks) {
  auto g = test::rng_for_test();
  const int64_t E = 2, N = 5, K = 7, bn = 2, bk = 3, nb = 3, kb = 3;
  std::vector<uint8_t> codes(E * N * K);
  std::uniform_int_distribution<int> d(0, 255);
  for (auto& c : codes) do c = uint8_t(d(g)); while (e4m3fn_is_nan(c));
  auto s = test::gaussian(g, E * nb * kb);
  PackedExperts p = pack_fp8(codes.data(), E, N, K, s.data(), bn, bk);
  std::vector<float> out(codes.size());
  unpack(p, out.data());
  for (int64_t i = 0; i < E * N * K; ++i) {
    const int64_t e = i / (N * K), n = (i / K) % N, k = i % K;
    ASSERT_EQ(out[i], float(e4m3_by_definition(codes[i])) * s[(e * nb + n / bn) * kb + k / bk]);
  }
}

TEST(Bf16Pack, RoundTrip) {
  std::vector<uint16_t> w = {0x3f80, 0xbf80, 0x0000, 0x4049, 0x0001, 0x7f7f};
  PackedExperts p = pack_bf16(w.data(), 1, 2, 3);
  std::vector<float> out(6);
  unpack(p, out.data());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(out[i], bf16_to_float(w[i]));
}

TEST(PackErrors, RejectBadInput) {
  std::vector<int8_t> q(64, 9);  // 9 is outside [-8, 7]
  std::vector<float> s(2, 1.f);
  EXPECT_THROW(pack_int4(q.data(), 1, 1, 64, s.data(), 32, nullptr), ValueError);
  std::vector<int8_t> ok(64, 1);
  EXPECT_THROW(pack_int4(ok.data(), 1, 1, 64, s.data(), 24, nullptr), ValueError);  // not a multiple of 16
  std::vector<float> s4(4, 1.f);
  EXPECT_NO_THROW(pack_int4(ok.data(), 1, 1, 64, s4.data(), 16, nullptr));  // W4A8: groups of 16 (GGUF IQ2_XS)
  EXPECT_THROW(pack_int4(ok.data(), 1, 1, 64, s4.data(), 16, nullptr, nullptr, nullptr, true), ValueError);  // A16: 32
  EXPECT_THROW(pack_int4(ok.data(), 1, 1, 64, s.data(), 128, nullptr), ValueError);  // does not divide K
  s[1] = NAN;
  EXPECT_THROW(pack_int4(ok.data(), 1, 1, 64, s.data(), 32, nullptr), ValueError);
  std::vector<uint8_t> nan_code = {0x7f};
  float one = 1.f;
  EXPECT_THROW(pack_fp8(nan_code.data(), 1, 1, 1, &one, 1, 1), ValueError);
}

// The int4 range check sees every position: whole k-steps (8 codes per load) and the partial last
// one (K = 21), with and without zero points; the error names the first bad flat index.
TEST(PackErrors, Int4RangeAtEveryPosition) {
  const int64_t N = 3, K = 21;
  std::vector<float> s(N, 1.f);
  for (bool zp : {false, true}) {
    std::vector<uint8_t> z(N, 0);
    for (int bad : zp ? std::vector<int>{16, 128, 255} : std::vector<int>{-128, -9, 8, 127})
      for (int64_t i = 0; i < N * K; ++i) {
        std::vector<int8_t> q(size_t(N * K), int8_t(zp ? 15 : -8));
        q[size_t(i)] = int8_t(bad);
        try {
          pack_int4(q.data(), 1, N, K, s.data(), -1, zp ? z.data() : nullptr);
          FAIL() << "accepted " << bad << " at " << i;
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("flat index " + std::to_string(i) + " ="), std::string::npos) << e.what();
        }
      }
  }
}

TEST(Quantize, FollowsTheRules) {
  // One int4 group of 32: amax 3.5 -> s = 0.5; 0.25 is a tie -> rint to even 0; 0.75 -> 2 (1.5 -> 2).
  std::vector<float> w(32, 0.f);
  w[0] = 3.5f, w[1] = 0.25f, w[2] = 0.75f, w[3] = -3.5f;
  PackedExperts p = quantize_experts(w.data(), 1, 1, 32, Scheme::kInt4W4A8, 32, 0, 0);
  std::vector<int8_t> q(32);
  p.int_row(0, 0, q.data());
  EXPECT_EQ(p.scale(0, 0, 0), 0.5f);
  EXPECT_EQ(q[0], 7);
  EXPECT_EQ(q[1], 0);
  EXPECT_EQ(q[2], 2);
  EXPECT_EQ(q[3], -7);
  // An all-zero group gets scale 1.
  std::vector<float> zero(32, 0.f);
  EXPECT_EQ(quantize_experts(zero.data(), 1, 1, 32, Scheme::kInt8W8A8, -1, 0, 0).scale(0, 0, 0), 1.f);
  // fp8: amax 448 in the block -> s = 1, codes are the exact values.
  std::vector<float> f = {448.f, 1.f, -2.f, 0.5f};
  PackedExperts p8 = quantize_experts(f.data(), 1, 2, 2, Scheme::kFp8W8A16, -1, 2, 2);
  std::vector<float> back(4);
  unpack(p8, back.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], f[i]);
}

}  // namespace
}  // namespace moe_cpu
