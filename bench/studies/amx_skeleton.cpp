// amx_skeleton.cpp — what the AMX kernels cost beyond the tile instructions, on any AVX-512 host (issue 26:
// no AMX host yet). The compiled kernels of int_amx.h / float_amx.h run on two stand-in tile backends:
//   null:  every tile instruction does nothing (the rest: widening, panel tails, epilogues, scales);
//   touch: tileloadd reads and tilestored writes the configured rows and bytes with AVX-512 (adds the
//          kernels' tile traffic through this CPU's caches); the dot products do nothing.
// Beside them: the AVX-512 twin on the same inputs, the tile dot products counted, and their time at the
// AMX peaks issue 26 measured on a Xeon (per core: 6.9 TOPS int8, 3.5 TFLOPS bf16). One thread, one
// Qwen3-30B-A3B expert (H 2048, I 768) at R rows: GEMM1 in fused_moe.cpp's L2 pieces, GEMM2 in one call.
// The estimate brackets the tile kernel: max(touch, tiles) if the AMX unit overlaps the rest, touch + tiles
// if not. Where AMX is active (not under tests/amx_trap), a last column times the real tiles. Built by CMake on x86 as moe_cpu_amx_skeleton; run: build/moe_cpu_amx_skeleton [reps] [scheme substring]
#define MOE_ISA amx  // kernels/isa.h: the stand-in backends are AVX-512 code in the amx region
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../../tests/cpp/kernel_test_util.h"
#include "common/numeric.h"
#include "kernels/float_amx.h"
#include "kernels/int_amx.h"
#include "kernels/isa.h"
#include "moe_cpu/cpu_features.h"

namespace moe_cpu {
extern const KernelDesc kernel_w8a8_avx512vnni, kernel_w4a8_avx512vnni, kernel_bf16_avx512bf16,
    kernel_fp8w_avx512vbmi;
}

using namespace moe_cpu;

MOE_ISA_BEGIN
namespace {

int64_t g_dots = 0, g_dot_bytes = 0;  // tile dot products, and the K bytes of their A tiles
kernels::TileConfig g_cfg;              // the configured tile shapes

template <bool kTouch, bool kCount = false>
struct StandIn {
  static constexpr bool kSimdPanels = true;
  static void configure(const kernels::TileConfig& c) { g_cfg = c; }
  static void release() {}
  template <int t> static void load(const void* p, int64_t stride) {
    if constexpr (kTouch) {
      const uint8_t* b = static_cast<const uint8_t*>(p);
      const __mmask64 m = g_cfg.colsb[t] >= 64 ? ~0ull : (1ull << g_cfg.colsb[t]) - 1;
      for (int r = 0; r < g_cfg.rows[t]; ++r) {  // independent loads (no chain through a sum)
        const __m512i x = _mm512_maskz_loadu_epi8(m, b + r * stride);
        __asm__ volatile("" : : "v"(x));
      }
    }
  }
  template <int t> static void store(void* p, int64_t stride) {
    if constexpr (kTouch)
      for (int r = 0; r < g_cfg.rows[t]; ++r) _mm512_storeu_si512(static_cast<uint8_t*>(p) + r * stride, _mm512_setzero_si512());
  }
  template <int t> static void zero() {}
  template <int c, int a, int b> static void dpbsud() {
    if constexpr (kCount) ++g_dots, g_dot_bytes += g_cfg.colsb[a];
  }
  template <int c, int a, int b> static void dpbf16ps() {
    if constexpr (kCount) ++g_dots, g_dot_bytes += g_cfg.colsb[a];
  }
};

using Gemm = void (*)(const PackedExperts&, int64_t, int64_t, int64_t, const ActRows&, float*, int64_t);

struct Case {
  const char* name;
  Scheme scheme;
  int64_t group;  // int: group size (-1 per channel); fp8: block_k
  const KernelDesc* twin;
  Gemm null_gemm, touch_gemm, count_gemm, amx_gemm;
};

// The kernel of int_amx.h (kInt; kFlag: int4) or float_amx.h (kFlag: fp8) on backend T.
template <bool kInt, bool kFlag, class T>
constexpr Gemm gemm_on() {
  if constexpr (kInt) return kernels::int_amx_gemm<T, kFlag>;
  else return kernels::float_amx_gemm<T, kFlag>;
}
template <bool kInt, bool kFlag>
Case make_case(const char* name, Scheme scheme, int64_t group, const KernelDesc* twin) {
  return {name, scheme, group, twin, gemm_on<kInt, kFlag, StandIn<false>>(), gemm_on<kInt, kFlag, StandIn<true>>(),
          gemm_on<kInt, kFlag, StandIn<false, true>>(), gemm_on<kInt, kFlag, kernels::AmxTiles>()};
}

struct Expert {
  PackedExperts w13, w2;
  test::Acts a1, a2;
};

PackedExperts make_weights(const Case& c, int64_t N, int64_t K, std::mt19937& g) {
  std::normal_distribution<float> nd;
  std::vector<float> w(size_t(N * K));
  for (float& x : w) x = nd(g);
  if (c.scheme == Scheme::kFp8W8A16) return quantize_experts(w.data(), 1, N, K, c.scheme, -1, 128, c.group);
  return quantize_experts(w.data(), 1, N, K, c.scheme, c.group, 128, 128);
}

test::Acts make_acts(const PackedExperts& p, int64_t R, std::mt19937& g) {
  test::Acts a;
  const int64_t K = p.in_features, Kp = p.padded_k(), G = p.num_groups(), gl = p.group_len();
  std::uniform_int_distribution<int> qd(-127, 127);
  std::normal_distribution<float> nd;
  if (is_int_scheme(p.scheme)) {
    a.q.assign(size_t(R * Kp), 0), a.asum.assign(size_t(R * G), 0), a.s.assign(size_t(R), 0.01f);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) a.q[r * Kp + k] = int8_t(qd(g)), a.asum[r * G + k / gl] += a.q[r * Kp + k];
  } else {
    a.b.assign(size_t(R * Kp), 0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) a.b[r * Kp + k] = float_to_bf16(nd(g));
    a.widen();
  }
  a.idx.resize(size_t(R));
  for (int64_t r = 0; r < R; ++r) a.idx[r] = int32_t(r);  // GEMM1 rows after task_rows' copy; GEMM2's rows
  return a;
}

// GEMM1 (gate and up, in fused_moe.cpp's pieces) and GEMM2 of one expert with `gemm`; seconds.
double run_expert(const Expert& x, int64_t R, Gemm gemm, std::vector<float>& out) {
  const int64_t I = x.w2.in_features, H = x.w2.out_features;
  const int64_t piece = std::max<int64_t>(64, (192 << 10) / (8 * R) / 64 * 64);
  const ActRows r1 = x.a1.view(x.w13, R), r2 = x.a2.view(x.w2, R);
  out.resize(size_t(R * std::max<int64_t>(2 * piece, H)));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s0 = 0; s0 < I; s0 += piece) {
    const int64_t n = std::min(I, s0 + piece) - s0, gb0 = s0 / 16, gb1 = (s0 + n + 15) / 16;
    const int64_t ub0 = (I + s0) / 16, ub1 = (I + s0 + n + 15) / 16, ld = 16 * (gb1 - gb0 + ub1 - ub0);
    gemm(x.w13, 0, gb0, gb1, r1, out.data(), ld);
    gemm(x.w13, 0, ub0, ub1, r1, out.data() + 16 * (gb1 - gb0), ld);
  }
  gemm(x.w2, 0, 0, x.w2.num_blocks(), r2, out.data(), H);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double best_of(const Expert& x, int64_t R, Gemm gemm, int reps, std::vector<float>& out) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) best = std::min(best, run_expert(x, R, gemm, out));
  return best;
}

}  // namespace
MOE_ISA_END

using namespace moe_cpu::kernels;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const uint64_t need = kFeatAmxKernels & ~kFeatAmx;
  if ((active_features() & need) != need) {
    std::printf("amx_skeleton: needs the AVX-512 the AMX files are compiled for (VNNI, BF16, VBMI)\n");
    return 0;
  }
  const Case cases[] = {
      make_case<true, false>("int8 per channel", Scheme::kInt8W8A8, -1, &kernel_w8a8_avx512vnni),
      make_case<true, true>("int4 g128", Scheme::kInt4W4A8, 128, &kernel_w4a8_avx512vnni),
      make_case<true, true>("int4 g32", Scheme::kInt4W4A8, 32, &kernel_w4a8_avx512vnni),
      make_case<true, true>("int4 per channel", Scheme::kInt4W4A8, -1, &kernel_w4a8_avx512vnni),
      make_case<false, false>("bf16", Scheme::kBf16, -1, &kernel_bf16_avx512bf16),
      make_case<false, true>("fp8 block 128", Scheme::kFp8W8A16, 128, &kernel_fp8w_avx512vbmi),
  };
  // Real tiles where AMX is active (not under tests/amx_trap, whose tiles are far too slow to time).
  const bool real = (active_features() & kFeatAmx) && !amx_emulated();
  const int64_t H = 2048, I = 768;
  std::printf("one Qwen3-30B-A3B expert (H %lld, I %lld), one thread, best of %d; ms per expert call\n", (long long)H,
              (long long)I, reps);
  std::printf("%-17s %4s %8s %8s %8s %8s %7s  %-22s %s%s\n", "scheme", "R", "avx512", "null", "touch", "tiles@pk", "dots",
              "est. tile kernel (ms)", "est. speedup over avx512", real ? "  amx (real tiles)" : "");
  std::mt19937 g(26);
  std::vector<float> out;
  for (const Case& c : cases) {
    if (argc > 2 && !std::strstr(c.name, argv[2])) continue;
    for (const int64_t R : {32, 64, 128, 256}) {
      Expert x{make_weights(c, 2 * I, H, g), make_weights(c, H, I, g), {}, {}};
      x.a1 = make_acts(x.w13, R, g), x.a2 = make_acts(x.w2, R, g);
      const double twin = best_of(x, R, c.twin->gemm, reps, out);
      g_dots = g_dot_bytes = 0;
      run_expert(x, R, c.count_gemm, out);
      const int64_t dots = g_dots, bytes = g_dot_bytes;
      const double null = best_of(x, R, c.null_gemm, reps, out), touch = best_of(x, R, c.touch_gemm, reps, out);
      // ops of the dot products at the issue's per-core peaks (a dot: 16 x 16 x colsb of A, 2 ops a MAC)
      const bool fl = c.scheme == Scheme::kBf16 || c.scheme == Scheme::kFp8W8A16;
      const double ops = 2.0 * 16 * 16 * double(bytes) / (fl ? 2 : 1), tiles = ops / (fl ? 3.5e12 : 6.9e12);
      const double lo = std::max(touch, tiles), hi = touch + tiles;
      char est[32], up[32];
      std::snprintf(est, sizeof est, "%.3f - %.3f", lo * 1e3, hi * 1e3);
      std::snprintf(up, sizeof up, "%.1f - %.1fx", twin / hi, twin / lo);
      std::printf("%-17s %4lld %8.3f %8.3f %8.3f %8.3f %7lld  %-22s %-*s", c.name, (long long)R, twin * 1e3, null * 1e3,
                  touch * 1e3, tiles * 1e3, (long long)dots, est, real ? 24 : 0, up);
      if (real) {
        const double amx = best_of(x, R, c.amx_gemm, reps, out);
        std::printf(" %8.3f ms, %.1fx", amx * 1e3, twin / amx);
      }
      std::printf("\n");
    }
  }
}
