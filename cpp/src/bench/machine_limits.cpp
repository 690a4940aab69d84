// machine_limits.cpp — read bandwidth and instruction peaks (see machine_limits.h). The SIMD bodies
// use target attributes or inline asm and run only after the feature checks, so this file builds
// with base flags.
#include "bench/machine_limits.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moe_cpu::bench {

struct ReadBuffer {
  uint8_t* p;
  size_t n;
};

ReadBuffer* make_read_buffer(size_t bytes) {
  bytes = std::max<size_t>(bytes, 4096);
  bytes = (bytes + (size_t(1) << 21) - 1) & ~((size_t(1) << 21) - 1);
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(size_t(1) << 21, bytes));
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // as the packed weights (packed_experts.cpp)
#endif
#pragma omp parallel for
  for (size_t i = 0; i < bytes; i += 4096) std::memset(p + i, int(i >> 12), 4096);
  return new ReadBuffer{p, bytes};
}
void free_read_buffer(ReadBuffer* b) {
  std::free(b->p);
  delete b;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Plain 64-bit loads, four independent streams (CPUs without AVX2).
uint64_t read_scalar(const uint8_t* p, size_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i < n; i += 32) {
    uint64_t v[4];
    std::memcpy(v, p + i, 32);
    a0 ^= v[0], a1 ^= v[1], a2 ^= v[2], a3 ^= v[3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void*)(p + i)));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void*)(p + i + 64)));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512((const void*)(p + i + 128)));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512((const void*)(p + i + 192)));
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  return uint64_t(_mm512_reduce_add_epi64(x));
}

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i*)(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i*)(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i*)(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i*)(p + i + 96)));
  }
  const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return uint64_t(_mm256_extract_epi64(x, 0) ^ _mm256_extract_epi64(x, 3));
}

// `iters` x 16 instructions of INSN into 16 independent accumulators (zmm0-15), sources zmm16/17.
#define MOE_PEAK_LOOP(INSN)                                                                         \
  asm volatile(                                                                                     \
      "vpxord %%zmm0, %%zmm0, %%zmm0\n vmovdqa64 %%zmm0, %%zmm1\n vmovdqa64 %%zmm0, %%zmm2\n"      \
      "vmovdqa64 %%zmm0, %%zmm3\n vmovdqa64 %%zmm0, %%zmm4\n vmovdqa64 %%zmm0, %%zmm5\n"           \
      "vmovdqa64 %%zmm0, %%zmm6\n vmovdqa64 %%zmm0, %%zmm7\n vmovdqa64 %%zmm0, %%zmm8\n"           \
      "vmovdqa64 %%zmm0, %%zmm9\n vmovdqa64 %%zmm0, %%zmm10\n vmovdqa64 %%zmm0, %%zmm11\n"         \
      "vmovdqa64 %%zmm0, %%zmm12\n vmovdqa64 %%zmm0, %%zmm13\n vmovdqa64 %%zmm0, %%zmm14\n"        \
      "vmovdqa64 %%zmm0, %%zmm15\n vmovdqa64 %%zmm0, %%zmm16\n vmovdqa64 %%zmm0, %%zmm17\n"        \
      "1:\n" INSN " %%zmm17, %%zmm16, %%zmm0\n" INSN " %%zmm17, %%zmm16, %%zmm1\n"                 \
      INSN " %%zmm17, %%zmm16, %%zmm2\n" INSN " %%zmm17, %%zmm16, %%zmm3\n"                         \
      INSN " %%zmm17, %%zmm16, %%zmm4\n" INSN " %%zmm17, %%zmm16, %%zmm5\n"                         \
      INSN " %%zmm17, %%zmm16, %%zmm6\n" INSN " %%zmm17, %%zmm16, %%zmm7\n"                         \
      INSN " %%zmm17, %%zmm16, %%zmm8\n" INSN " %%zmm17, %%zmm16, %%zmm9\n"                         \
      INSN " %%zmm17, %%zmm16, %%zmm10\n" INSN " %%zmm17, %%zmm16, %%zmm11\n"                       \
      INSN " %%zmm17, %%zmm16, %%zmm12\n" INSN " %%zmm17, %%zmm16, %%zmm13\n"                       \
      INSN " %%zmm17, %%zmm16, %%zmm14\n" INSN " %%zmm17, %%zmm16, %%zmm15\n"                       \
      "dec %0\n jnz 1b\n vzeroupper\n"                                                               \
      : "+r"(iters)                                                                                 \
      :                                                                                             \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",     \
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc")

__attribute__((target("avx512f"))) void vnni_zmm_loop(int64_t iters) { MOE_PEAK_LOOP("vpdpbusd"); }
__attribute__((target("avx512f"))) void bf16_zmm_loop(int64_t iters) { MOE_PEAK_LOOP("vdpbf16ps"); }
__attribute__((target("avx512f"))) void wssd_zmm_loop(int64_t iters) { MOE_PEAK_LOOP("vpdpwssd"); }
#undef MOE_PEAK_LOOP

// ymm loops (VEX only, ymm0-15): 12 accumulators ymm0-11 per iteration, sources ymm13-15.
#define MOE_YMM_ZERO                                                                                 \
  "vpxor %%xmm0, %%xmm0, %%xmm0\n vmovdqa %%ymm0, %%ymm1\n vmovdqa %%ymm0, %%ymm2\n"                \
  "vmovdqa %%ymm0, %%ymm3\n vmovdqa %%ymm0, %%ymm4\n vmovdqa %%ymm0, %%ymm5\n"                     \
  "vmovdqa %%ymm0, %%ymm6\n vmovdqa %%ymm0, %%ymm7\n vmovdqa %%ymm0, %%ymm8\n"                     \
  "vmovdqa %%ymm0, %%ymm9\n vmovdqa %%ymm0, %%ymm10\n vmovdqa %%ymm0, %%ymm11\n"                   \
  "vmovdqa %%ymm0, %%ymm13\n vmovdqa %%ymm0, %%ymm14\n vmovdqa %%ymm0, %%ymm15\n"
#define MOE_YMM_CLOBBERS                                                                             \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",  \
      "xmm12", "xmm13", "xmm14", "xmm15", "cc"
#define MOE_YMM12(INSN)                                                                              \
  INSN " %%ymm15, %%ymm14, %%ymm0\n" INSN " %%ymm15, %%ymm14, %%ymm1\n"                             \
  INSN " %%ymm15, %%ymm14, %%ymm2\n" INSN " %%ymm15, %%ymm14, %%ymm3\n"                             \
  INSN " %%ymm15, %%ymm14, %%ymm4\n" INSN " %%ymm15, %%ymm14, %%ymm5\n"                             \
  INSN " %%ymm15, %%ymm14, %%ymm6\n" INSN " %%ymm15, %%ymm14, %%ymm7\n"                             \
  INSN " %%ymm15, %%ymm14, %%ymm8\n" INSN " %%ymm15, %%ymm14, %%ymm9\n"                             \
  INSN " %%ymm15, %%ymm14, %%ymm10\n" INSN " %%ymm15, %%ymm14, %%ymm11\n"

void fma_ymm_loop(int64_t iters) {
  asm volatile(MOE_YMM_ZERO "1:\n" MOE_YMM12("vfmadd231ps") "dec %0\n jnz 1b\n vzeroupper\n"
               : "+r"(iters) : : MOE_YMM_CLOBBERS);
}
void vnni_ymm_loop(int64_t iters) {
  asm volatile(MOE_YMM_ZERO "1:\n" MOE_YMM12("%{vex%} vpdpbusd") "dec %0\n jnz 1b\n vzeroupper\n"
               : "+r"(iters) : : MOE_YMM_CLOBBERS);
}
// The AVX2 int8 dot product of w8a8_avx2 / w4a8_avx2: u8 x s8 pairs to int16 (vpmaddubsw), int16
// pairs to int32 (vpmaddwd with ones in ymm13), int32 accumulate (vpaddd). 12 chains per iteration
// into 6 accumulators (ymm0-5) through 6 temporaries (ymm6-11).
#define MOE_CHAIN(T, A)                                                                              \
  "vpmaddubsw %%ymm15, %%ymm14, %%ymm" T "\n vpmaddwd %%ymm13, %%ymm" T ", %%ymm" T "\n"             \
  "vpaddd %%ymm" T ", %%ymm" A ", %%ymm" A "\n"
void maddubs_ymm_loop(int64_t iters) {
  asm volatile(MOE_YMM_ZERO "1:\n" MOE_CHAIN("6", "0") MOE_CHAIN("7", "1") MOE_CHAIN("8", "2") MOE_CHAIN("9", "3")
               MOE_CHAIN("10", "4") MOE_CHAIN("11", "5") MOE_CHAIN("6", "0") MOE_CHAIN("7", "1") MOE_CHAIN("8", "2")
               MOE_CHAIN("9", "3") MOE_CHAIN("10", "4") MOE_CHAIN("11", "5") "dec %0\n jnz 1b\n vzeroupper\n"
               : "+r"(iters) : : MOE_YMM_CLOBBERS);
}
#undef MOE_CHAIN
// The AVX2 int16 dot product of w4a16_avx2 / w8a16_avx2: int16 pairs to int32 (vpmaddwd), int32
// accumulate (vpaddd); 12 chains per iteration into 6 accumulators through 6 temporaries.
#define MOE_CHAIN(T, A) "vpmaddwd %%ymm15, %%ymm14, %%ymm" T "\n vpaddd %%ymm" T ", %%ymm" A ", %%ymm" A "\n"
void maddwd_ymm_loop(int64_t iters) {
  asm volatile(MOE_YMM_ZERO "1:\n" MOE_CHAIN("6", "0") MOE_CHAIN("7", "1") MOE_CHAIN("8", "2") MOE_CHAIN("9", "3")
               MOE_CHAIN("10", "4") MOE_CHAIN("11", "5") MOE_CHAIN("6", "0") MOE_CHAIN("7", "1") MOE_CHAIN("8", "2")
               MOE_CHAIN("9", "3") MOE_CHAIN("10", "4") MOE_CHAIN("11", "5") "dec %0\n jnz 1b\n vzeroupper\n"
               : "+r"(iters) : : MOE_YMM_CLOBBERS);
}
#undef MOE_CHAIN
#undef MOE_YMM12
#undef MOE_YMM_CLOBBERS
#undef MOE_YMM_ZERO
#endif

#if defined(__x86_64__)
// AMX: `iters` x 4 tile dot products into 4 independent C tiles (tmm0-3) from A tmm4-5 and B tmm6-7,
// all 16 rows x 64 bytes (palette 1), configured and released by each thread.
#define MOE_AMX_LOOP(INSN)                                                                           \
  alignas(64) uint8_t cfg[64] = {1};                                                                \
  for (int t = 0; t < 8; ++t) cfg[16 + 2 * t] = 64, cfg[48 + t] = 16;                               \
  asm volatile("ldtilecfg %1\n tilezero %%tmm0\n tilezero %%tmm1\n tilezero %%tmm2\n tilezero %%tmm3\n" \
               "tilezero %%tmm4\n tilezero %%tmm5\n tilezero %%tmm6\n tilezero %%tmm7\n"             \
               "1:\n" INSN " %%tmm6, %%tmm4, %%tmm0\n" INSN " %%tmm7, %%tmm4, %%tmm1\n"               \
               INSN " %%tmm6, %%tmm5, %%tmm2\n" INSN " %%tmm7, %%tmm5, %%tmm3\n"                      \
               "dec %0\n jnz 1b\n tilerelease\n"                                                     \
               : "+r"(iters) : "m"(cfg) : "cc", "memory")
void tdpbssd_loop(int64_t iters) { MOE_AMX_LOOP("tdpbssd"); }
void tdpbf16ps_loop(int64_t iters) { MOE_AMX_LOOP("tdpbf16ps"); }
#undef MOE_AMX_LOOP
#endif

// Runs loop(iters) on `threads` threads at once; returns loop iterations per second (all threads).
double iter_rate(void (*loop)(int64_t), int threads, double seconds) {
  int64_t iters = 1 << 12;
  for (;;) {  // calibrate on one thread
    auto t0 = Clock::now();
    loop(iters);
    if (seconds_since(t0) > 0.02) break;
    iters *= 4;
  }
  auto t0 = Clock::now();
  loop(iters);
  const double one = seconds_since(t0);
  iters = std::max<int64_t>(1, int64_t(double(iters) * seconds / one));
  t0 = Clock::now();
#pragma omp parallel num_threads(threads)
  loop(iters);
  return double(iters) * threads / seconds_since(t0);
}

struct PeakLoop {
  PeakInsn insn;
  void (*loop)(int64_t);
  int per_iter;  // instructions (chains) per loop iteration
};

const std::vector<PeakLoop>& peak_loops() {
  static const std::vector<PeakLoop> loops = {
#if defined(__x86_64__)
      {{"vpdpbusd_zmm", "vpdpbusd zmm (AVX-512 VNNI)", kFeatAvx512 | kFeatAvx512Vnni, 16 * 4 * 2}, vnni_zmm_loop, 16},
      {{"vdpbf16ps_zmm", "vdpbf16ps zmm (AVX512_BF16)", kFeatAvx512 | kFeatAvx512Bf16, 16 * 2 * 2}, bf16_zmm_loop, 16},
      {{"vpdpwssd_zmm", "vpdpwssd zmm (AVX-512 VNNI)", kFeatAvx512 | kFeatAvx512Vnni, 16 * 2 * 2}, wssd_zmm_loop, 16},
      {{"vpdpbusd_ymm", "{vex} vpdpbusd ymm (AVX-VNNI)", kFeatAvx2 | kFeatAvxVnni, 8 * 4 * 2}, vnni_ymm_loop, 12},
      {{"maddubs_ymm", "vpmaddubsw + vpmaddwd + vpaddd ymm (AVX2)", kFeatAvx2, 32 * 2}, maddubs_ymm_loop, 12},
      {{"maddwd_ymm", "vpmaddwd + vpaddd ymm (AVX2)", kFeatAvx2, 16 * 2}, maddwd_ymm_loop, 12},
      {{"fma_ymm", "vfmadd231ps ymm (AVX2 + FMA)", kFeatAvx2, 8 * 2}, fma_ymm_loop, 12},
      {{"tdpbssd_amx", "tdpbssd 16x16x64 (AMX-INT8)", kFeatAmx, 16 * 16 * 64 * 2}, tdpbssd_loop, 4},
      {{"tdpbf16ps_amx", "tdpbf16ps 16x16x32 (AMX-BF16)", kFeatAmx, 16 * 16 * 32 * 2}, tdpbf16ps_loop, 4},
#endif
  };
  return loops;
}

}  // namespace

double read_bandwidth_gbs(ReadBuffer* b, int threads, int reps) {
  const uint64_t f = detected_features();
  double best = 0;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(^ : sink)
    {
      const size_t slice = b->n / size_t(omp_get_num_threads()) / 256 * 256;
      const uint8_t* p = b->p + slice * size_t(omp_get_thread_num());
#if defined(__x86_64__)
      sink ^= (f & kFeatAvx512) ? read_avx512(p, slice) : (f & kFeatAvx2) ? read_avx2(p, slice) : read_scalar(p, slice);
#else
      (void)f;
      sink ^= read_scalar(p, slice);
#endif
    }
    best = std::max(best, double(b->n / 256 * 256) / seconds_since(t0) / 1e9);
  }
  if (sink == 42) best += 1e-12;  // keep the reads
  return best;
}

const std::vector<PeakInsn>& peak_instructions() {
  static const std::vector<PeakInsn> v = [] {
    std::vector<PeakInsn> out;
    for (const PeakLoop& l : peak_loops()) out.push_back(l.insn);
    return out;
  }();
  return v;
}

double instruction_peak_tops(const std::string& name, int threads, double seconds) {
  for (const PeakLoop& l : peak_loops()) {
    if (name != l.insn.name) continue;
    const uint64_t missing = l.insn.features & ~detected_features();
    if (missing) {
      std::string names;
      for (const auto& n : feature_names(missing)) names += (names.empty() ? "" : ", ") + n;
      throw ValueError(msg("peak of ", l.insn.what, ": this CPU lacks ", names));
    }
    if ((l.insn.features & kFeatAmx) && amx_emulated())
      throw ValueError(msg("peak of ", l.insn.what, ": the tiles are emulated here (", amx_status(), ")"));
    if (threads < 1) throw ValueError(msg("threads = ", threads, " must be >= 1"));
    return iter_rate(l.loop, threads, seconds) * l.per_iter * l.insn.ops / 1e12;
  }
  std::string names;
  for (const PeakLoop& l : peak_loops()) names += std::string(names.empty() ? "" : ", ") + l.insn.name;
  throw ValueError(msg("unknown peak instruction '", name, "' (known here: ", names.empty() ? "none" : names, ")"));
}

}  // namespace moe_cpu::bench
