// test_amx.cpp — the scalar tile model against direct computations of the SDM's definitions (partial
// tile shapes, zeroed upper rows and columns, int32 wrap-around, bf16 DAZ / FTZ, rounding per step),
// and the ISA levels amx / amx_model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/numeric.h"
#include "kernels/amx_tiles.h"
#if defined(__x86_64__)
#include "kernels/amx_panels.h"
#endif
#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"
#include "moe_cpu/packed_experts.h"
#include "test_util.h"

namespace moe_cpu {
namespace {
using kernels::TileConfig;
using kernels::TileModel;

// C 0: 5 rows x 10 int32; A 4: 5 rows x 24 bytes; B 6: 6 rows x 40 bytes (partial everywhere).
TileConfig partial_config() {
  TileConfig c;
  c.rows[0] = 5, c.colsb[0] = 40;
  c.rows[4] = 5, c.colsb[4] = 24;
  c.rows[6] = 6, c.colsb[6] = 40;
  return c;
}

TEST(TileModel, DpbsudIsTheSdmDefinitionOnPartialTiles) {
  auto g = test::rng_for_test();
  const auto a = test::ints(g, 16 * 64, -128, 127);
  const auto b8 = test::ints(g, 16 * 64, -128, 127);
  std::vector<uint8_t> b(b8.begin(), b8.end());
  std::vector<int32_t> c0(16 * 16);
  for (auto& v : c0) v = int32_t(g());
  c0[0] = INT32_MAX;  // wraps
  TileModel::configure(partial_config());
  TileModel::load<0>(c0.data(), 64);
  TileModel::load<4>(a.data(), 64);
  TileModel::load<6>(b.data(), 64);
  TileModel::dpbsud<0, 4, 6>();
  std::vector<int32_t> got(16 * 16, -1);
  TileModel::store<0>(got.data(), 64);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      if (m >= 5 || n >= 10) {
        EXPECT_EQ(got[m * 16 + n], -1) << "store writes rows x colsb only";
        continue;
      }
      int64_t want = c0[m * 16 + n];
      for (int k = 0; k < 6; ++k)  // A's 24 bytes: 6 dwords, one per B row
        for (int i = 0; i < 4; ++i) want += int64_t(a[m * 64 + 4 * k + i]) * int64_t(b[k * 64 + 4 * n + i]);
      EXPECT_EQ(got[m * 16 + n], int32_t(uint32_t(uint64_t(want)))) << m << "," << n;
    }
  // the rows and bytes outside the configured shape read as zero
  const TileModel::State& st = TileModel::s();
  for (int m = 0; m < 16; ++m)
    for (int i = 0; i < 64; ++i)
      if (m >= 5 || i >= 40) ASSERT_EQ(st.reg[0][m][i], 0) << m << "," << i;
}

TEST(TileModel, Dpbf16psRoundsEachStepAndFlushesDenormals) {
  TileConfig c;
  c.rows[0] = 2, c.colsb[0] = 64;
  c.rows[4] = 2, c.colsb[4] = 8;  // two pairs of k
  c.rows[6] = 2, c.colsb[6] = 64;
  const float tiny = std::ldexp(1.f, -130);  // a bf16 denormal: read as zero
  const float a[2][4] = {{1.f, tiny, std::ldexp(1.f, -70), 3.f}, {1.f, 1.f, 1.f, 1.f}};
  // B row k, column n: the pair (k-pair k's even, odd weight)
  const float b[2][4][2] = {{{16777216.f, 0.f}, {1.f, std::ldexp(1.f, -24)}, {0.f, std::ldexp(1.f, 120)}, {0.f, 0.f}},
                            {{0.f, 1.f}, {std::ldexp(1.f, -24), 0.f}, {0.f, 0.f}, {std::ldexp(1.f, -70), 0.f}}};
  std::vector<uint16_t> ab(2 * 32, 0), bb(2 * 32, 0);
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < 4; ++i) ab[m * 32 + i] = float_to_bf16(a[m][i]);
  for (int k = 0; k < 2; ++k)
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 2; ++i) bb[k * 32 + 2 * n + i] = float_to_bf16(b[k][n][i]);
  TileModel::configure(c);
  TileModel::zero<0>();
  TileModel::load<4>(ab.data(), 64);
  TileModel::load<6>(bb.data(), 64);
  TileModel::dpbf16ps<0, 4, 6>();
  float got[2][16];
  TileModel::store<0>(got, 64);
  EXPECT_EQ(got[0][0], 16777220.f) << "2^24 + 3 rounds to even (2^24 + 4)";
  EXPECT_EQ(got[0][2], 0.f) << "the denormal input reads as zero (DAZ): not 2^-10";
  EXPECT_EQ(got[0][3], 0.f) << "the denormal product 2^-140 is flushed (FTZ)";
  EXPECT_EQ(got[1][1], 1.f) << "each step rounds: 1 + 2^-24 + 2^-24 stays 1 (one sum would give 1 + 2^-23)";
}

#if defined(__x86_64__)
// The amx kernels' AVX-512 int4 widening and fp8 decode against the portable versions the model runs.
TEST(AmxPanels, Avx512WidenAndDecodeMatchThePortableCode) {
  const uint64_t need = kFeatAvx512 | kFeatAvx512Vbmi;
  if ((active_features() & need) != need) GTEST_SKIP() << "needs AVX-512 BW and VBMI";
  auto g = test::rng_for_test();
  const int8_t iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (const int64_t K : {8, 40, 64, 136}) {  // panel rows 1, 5, 8, 17
    for (const bool codebook : {false, true}) {
      const int64_t E = 2, N = 40, Kt = (K + 63) / 64 * 64;
      const auto q = codebook ? test::ints(g, E * N * K, 0, 15) : test::ints(g, E * N * K, -8, 7);
      const std::vector<float> s(size_t(E * N), 1.f);
      const PackedExperts p = pack_int4(q.data(), E, N, K, s.data(), -1, nullptr, codebook ? iq4nl : nullptr);
      std::vector<uint8_t> want(size_t(2 * Kt * 16), 7), got(want.size(), 9);
      kernels::widen_int4(p, 1, 1, 2, Kt, want.data());
      kernels::widen_int4_avx512(p, 1, 1, 2, Kt, got.data());
      ASSERT_EQ(got, want) << "K " << K << (codebook ? " with a codebook" : "");
    }
  }
  for (const int64_t K : {2, 34, 64, 98}) {  // 32, 544, 1024, 1568 codes per panel
    const int64_t E = 1, N = 20, Kt = (K + 31) / 32 * 32;
    std::vector<uint8_t> codes;
    for (const int c : test::ints(g, E * N * K, 0, 255)) codes.push_back(e4m3fn_is_nan(uint8_t(c)) ? 0 : uint8_t(c));
    const float one = 1.f;
    const PackedExperts p = pack_fp8(codes.data(), E, N, K, &one, N, K);
    std::vector<uint16_t> want(size_t(2 * Kt * 16), 7), got(want.size(), 9);
    kernels::decode_fp8(p, 0, 0, 2, Kt, want.data());
    kernels::decode_fp8_avx512(p, 0, 0, 2, Kt, got.data());
    ASSERT_EQ(got, want) << "K " << K;
  }
}

// Where the CPU has AMX, the amx kernels take the tiles for every row count in this binary (the
// GEMM cases have 1 to 257 rows); their AVX-512 twins are tested as kernels of their own.
const bool kTilesForEveryRowCount = (set_amx_min_rows(1), true);

TEST(AmxLevels, AmxStatusExplainsDetection) {
  EXPECT_TRUE(kTilesForEveryRowCount && amx_min_rows() == 1);
  const bool amx = detected_features() & kFeatAmx;
  EXPECT_EQ(amx, amx_status() == "granted") << amx_status();
  EXPECT_TRUE(detected_features() & kFeatAmxModel);
  EXPECT_FALSE(active_features() & kFeatAmxModel) << "the model is not a dispatch path unless forced";
}

TEST(AmxLevels, ForcingLevelsMasksTheTiles) {
  const std::string level = forced_isa();
  force_isa("amx_model");
  EXPECT_EQ(active_features(), uint64_t(kFeatAmxModel));
  if (detected_features() & kFeatAvx512) {
    force_isa("avx512");
    EXPECT_FALSE(active_features() & (kFeatAmx | kFeatAmxModel));
  }
  if (detected_features() & kFeatAmx) {
    force_isa("amx");
    EXPECT_TRUE(active_features() & kFeatAmx);
  } else {
    try {
      force_isa("amx");
      ADD_FAILURE() << "amx forced without AMX";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("AMX: "), std::string::npos) << e.what();
    }
  }
  force_isa(level);
}
#endif

}  // namespace
}  // namespace moe_cpu
