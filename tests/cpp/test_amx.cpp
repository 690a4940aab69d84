// test_amx.cpp — the scalar tile model against direct computations of the SDM's definitions (partial
// tile shapes, zeroed upper rows and columns, int32 wrap-around, bf16 DAZ / FTZ, rounding per step),
// and the ISA levels amx / amx_model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/numeric.h"
#include "kernels/amx_tiles.h"
#if defined(__x86_64__)
#include <dlfcn.h>

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
      kernels::amx::widen_int4_avx512(p, 1, 1, 2, Kt, got.data());
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
    kernels::amx::decode_fp8_avx512(p, 0, 0, 2, Kt, got.data());
    ASSERT_EQ(got, want) << "K " << K;
  }
}

// Where the CPU has AMX, the amx kernels take the tiles for every row count in this binary (the
// GEMM cases have 1 to 257 rows); their AVX-512 twins are tested as kernels of their own.
const bool kTilesForEveryRowCount = (set_amx_min_rows(1), true);

// The SIGILL trap of tests/amx_trap, where this process loaded it (ctest's amx_trap.kernels).
bool trap_loaded() { return dlsym(RTLD_DEFAULT, "moe_cpu_amx_trap") != nullptr; }

TEST(AmxLevels, AmxStatusExplainsDetection) {
  EXPECT_TRUE(kTilesForEveryRowCount && amx_min_rows() == 1);
  const bool amx = detected_features() & kFeatAmx;
  if (amx_emulated()) {
    EXPECT_TRUE(amx && trap_loaded());
    EXPECT_EQ(amx_status().rfind("emulated: ", 0), 0u) << amx_status();
  } else {
    EXPECT_EQ(amx, amx_status() == "granted") << amx_status();
    // The trap wins over real tiles too (the tile data is left unrequested), so it is used wherever the
    // AMX kernels' AVX-512 is.
    const uint64_t simd = kFeatAmxKernels & ~uint64_t(kFeatAmx);
    if (trap_loaded()) EXPECT_NE(detected_features() & simd, simd) << amx_status();
  }
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
// Each tile instruction form the kernels and the bench use, written out with unusual operands (a
// RIP-relative config, r12-r15 with SIB scale 2 and 4, 8- and 32-bit displacements, partial shapes),
// against sums computed here: on real tiles, or decoded and run by the SIGILL trap. Values are exact in
// every order of summation (bf16: small integers), so the hardware and the trap must both match.
alignas(64) TileConfig g_trap_cfg;  // static: the asm reads it RIP-relative
struct TrapCase {
  uint8_t* a;   // A rows at a + 128 m (7 x 36 bytes), read as 8(r12, r13 = 64, 2)
  uint8_t* b;   // B rows at b + 96 k (9 x 44 bytes), read as 0x200(r14, r15 = 96, 1)
  uint8_t* c;   // C's start, rows at c + 64 m (7 x 44 bytes)
  uint8_t* o;   // the result, stored as 16(o - 16, 16, 4): rows at o + 64 m
  uint8_t* z;   // tile 1 after tilezero, rows at z + 64 m
};
#define MOE_TRAP_RUN(INSN)                                                                                 \
  [](const TrapCase& t) {                                                                                 \
    register uint8_t* r12 __asm__("r12") = t.a - 8;                                                       \
    register int64_t r13 __asm__("r13") = 64;                                                             \
    register uint8_t* r14 __asm__("r14") = t.b - 0x200;                                                   \
    register int64_t r15 __asm__("r15") = 96;                                                             \
    __asm__ volatile("ldtilecfg %[cfg]\n tileloadd 8(%%r12,%%r13,2), %%tmm4\n"                              \
                     "tileloadd 0x200(%%r14,%%r15,1), %%tmm6\n tileloadd (%[c],%[cs],1), %%tmm0\n"          \
                     INSN " %%tmm6, %%tmm4, %%tmm0\n tilestored %%tmm0, 16(%[o],%[os],4)\n"                   \
                     "tilezero %%tmm1\n tilestored %%tmm1, (%[z],%[cs],1)\n tilerelease\n"                    \
                     : : [cfg] "m"(g_trap_cfg), "r"(r12), "r"(r13), "r"(r14), "r"(r15), [c] "r"(t.c),    \
                       [cs] "r"(int64_t(64)), [o] "r"(t.o - 16), [os] "r"(int64_t(16)), [z] "r"(t.z)       \
                     : "memory");                                                                         \
  }

TEST(AmxTrap, InstructionFormsMatchDirectSums) {
  if (!trap_loaded() && !(detected_features() & kFeatAmx))
    GTEST_SKIP() << "no AMX and no SIGILL trap in this process (ctest's amx_trap.kernels loads it)";
  g_trap_cfg = TileConfig{};
  for (int t : {0, 1}) g_trap_cfg.rows[t] = 7, g_trap_cfg.colsb[t] = 44;
  g_trap_cfg.rows[4] = 7, g_trap_cfg.colsb[4] = 36;
  g_trap_cfg.rows[6] = 9, g_trap_cfg.colsb[6] = 44;
  auto g = test::rng_for_test();
  struct Form {
    const char* name;
    void (*run)(const TrapCase&);
    int a_signed, b_signed;  // -1: bf16
  };
  const Form forms[] = {{"tdpbssd", MOE_TRAP_RUN("tdpbssd"), 1, 1}, {"tdpbsud", MOE_TRAP_RUN("tdpbsud"), 1, 0},
                        {"tdpbusd", MOE_TRAP_RUN("tdpbusd"), 0, 1}, {"tdpbuud", MOE_TRAP_RUN("tdpbuud"), 0, 0},
                        {"tdpbf16ps", MOE_TRAP_RUN("tdpbf16ps"), -1, -1}};
  for (const Form& f : forms) {
    const bool bf = f.a_signed < 0;
    std::vector<uint8_t> a(7 * 128), b(9 * 96), c(7 * 64), o(7 * 64, 0xee), z(7 * 64, 0xee);
    auto small_bf16 = [&](uint8_t* p) {  // an integer in [-4, 4] as bf16
      const uint16_t h = float_to_bf16(float(int(g() % 9) - 4));
      std::memcpy(p, &h, 2);
    };
    for (size_t i = 0; i < a.size(); i += 2) {
      if (bf) small_bf16(&a[i]);
      else a[i] = uint8_t(g()), a[i + 1] = uint8_t(g());
    }
    for (size_t i = 0; i < b.size(); i += 2) {
      if (bf) small_bf16(&b[i]);
      else b[i] = uint8_t(g()), b[i + 1] = uint8_t(g());
    }
    for (size_t i = 0; i < c.size(); i += 4) {
      const int32_t v = bf ? 0 : int32_t(g());
      const float fv = float(int(g() % 100) - 50);
      bf ? std::memcpy(&c[i], &fv, 4) : std::memcpy(&c[i], &v, 4);
    }
    f.run({a.data(), b.data(), c.data(), o.data(), z.data()});
    for (int m = 0; m < 7; ++m)
      for (int n = 0; n < 16; ++n) {
        if (n >= 11) {  // outside the 44 bytes of a row: untouched
          ASSERT_EQ(o[m * 64 + 4 * n], 0xee) << f.name;
          ASSERT_EQ(z[m * 64 + 4 * n], 0xee) << f.name;
          continue;
        }
        uint32_t zv;
        std::memcpy(&zv, &z[m * 64 + 4 * n], 4);
        ASSERT_EQ(zv, 0u) << f.name << " tilezero";
        if (bf) {
          float want, got;
          std::memcpy(&want, &c[m * 64 + 4 * n], 4);
          for (int k = 0; k < 9; ++k)
            for (int i = 0; i < 2; ++i)
              want += bf16_to_float(uint16_t(a[m * 128 + 4 * k + 2 * i] | a[m * 128 + 4 * k + 2 * i + 1] << 8)) *
                      bf16_to_float(uint16_t(b[k * 96 + 4 * n + 2 * i] | b[k * 96 + 4 * n + 2 * i + 1] << 8));
          std::memcpy(&got, &o[m * 64 + 4 * n], 4);
          ASSERT_EQ(got, want) << f.name << " " << m << "," << n;
        } else {
          int32_t c0, got;
          std::memcpy(&c0, &c[m * 64 + 4 * n], 4);
          uint32_t want = uint32_t(c0);
          for (int k = 0; k < 9; ++k)
            for (int i = 0; i < 4; ++i) {
              const uint8_t x = a[m * 128 + 4 * k + i], y = b[k * 96 + 4 * n + i];
              want += uint32_t((f.a_signed ? int32_t(int8_t(x)) : int32_t(x)) * (f.b_signed ? int32_t(int8_t(y)) : int32_t(y)));
            }
          std::memcpy(&got, &o[m * 64 + 4 * n], 4);
          ASSERT_EQ(uint32_t(got), want) << f.name << " " << m << "," << n;
        }
      }
  }
}
#undef MOE_TRAP_RUN

// What the SDM makes fault stops the model, as the CPU would stop the process.
TEST(TileModelDeathTest, FaultsWhereTheSdmDoes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TileConfig half = partial_config();
  half.colsb[4] = 0;
  EXPECT_DEATH(TileModel::configure(half), "ldtilecfg faults: a tile with rows but no bytes per row");
  TileConfig wide = partial_config();
  wide.colsb[6] = 68;
  EXPECT_DEATH(TileModel::configure(wide), "ldtilecfg faults: a tile over 16 rows or 64 bytes");
  TileConfig k_off = partial_config();
  k_off.rows[6] = 5;  // A's 24 bytes are 6 dwords: B needs 6 rows
  EXPECT_DEATH((TileModel::configure(k_off), TileModel::dpbsud<0, 4, 6>()), "tdpbsud faults: tile shapes do not chain");
  std::vector<uint8_t> buf(16 * 64);
  EXPECT_DEATH((TileModel::configure(partial_config()), TileModel::release(), TileModel::load<0>(buf.data(), 64)),
               "tileloadd faults: tiles not configured");
  EXPECT_DEATH((TileModel::configure(partial_config()), TileModel::dpbf16ps(0, 4, 4)),
               "tdpbf16ps faults: the three tiles are not distinct");
}
#endif

}  // namespace
}  // namespace moe_cpu
