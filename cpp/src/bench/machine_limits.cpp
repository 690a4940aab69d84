// machine_limits.cpp — read bandwidth and instruction peaks (see machine_limits.h). The SIMD bodies
// use target attributes and run only after the feature checks, so this file builds with base flags.
#include "bench/machine_limits.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "moe_cpu/cpu_features.h"
#include "moe_cpu/errors.h"

namespace moe_cpu::bench {

struct ReadBuffer {
  uint8_t* p;
  size_t n;
};

ReadBuffer* make_read_buffer(size_t bytes) {
  bytes = std::max<size_t>(bytes / 4096 * 4096, 4096);
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  if (!p) throw std::bad_alloc();
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

__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_stream_load_si512((void*)(p + i)));
    a1 = _mm512_xor_si512(a1, _mm512_stream_load_si512((void*)(p + i + 64)));
    a2 = _mm512_xor_si512(a2, _mm512_stream_load_si512((void*)(p + i + 128)));
    a3 = _mm512_xor_si512(a3, _mm512_stream_load_si512((void*)(p + i + 192)));
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  return uint64_t(_mm512_reduce_add_epi64(x));
}

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_stream_load_si256((const __m256i*)(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_stream_load_si256((const __m256i*)(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_stream_load_si256((const __m256i*)(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_stream_load_si256((const __m256i*)(p + i + 96)));
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
      "dec %0\n jnz 1b\n"                                                                            \
      : "+r"(iters)                                                                                 \
      :                                                                                             \
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",     \
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc")

__attribute__((target("avx512f,avx512vnni"))) void vnni_loop(int64_t iters) { MOE_PEAK_LOOP("vpdpbusd"); }
__attribute__((target("avx512f,avx512bf16"))) void bf16_loop(int64_t iters) { MOE_PEAK_LOOP("vdpbf16ps"); }
#undef MOE_PEAK_LOOP

// Runs loop(iters) on `threads` threads at once; returns instructions per second (all threads).
template <class Loop>
double instr_rate(Loop loop, int threads, double seconds) {
  int64_t iters = 1 << 16;
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
  return double(iters) * 16 * threads / seconds_since(t0);
}

}  // namespace

double read_bandwidth_gbs(ReadBuffer* b, int threads, int reps) {
  const uint64_t f = detected_features();
  if (!(f & (kFeatAvx512 | kFeatAvx2))) throw ValueError("read_bandwidth needs AVX2 or AVX-512");
  double best = 0;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(^ : sink)
    {
      const size_t slice = b->n / size_t(omp_get_num_threads()) / 256 * 256;
      const uint8_t* p = b->p + slice * size_t(omp_get_thread_num());
      sink ^= (f & kFeatAvx512) ? read_avx512(p, slice) : read_avx2(p, slice);
    }
    best = std::max(best, double(b->n / 256 * 256) / seconds_since(t0) / 1e9);
  }
  if (sink == 42) best += 1e-12;  // keep the reads
  return best;
}

double vpdpbusd_peak_tops(int threads, double seconds) {
  if (!(detected_features() & kFeatAvx512Vnni)) throw ValueError("this CPU has no AVX-512 VNNI");
  return instr_rate(vnni_loop, threads, seconds) * 16 * 4 * 2 / 1e12;  // 16 lanes x 4 MACs x 2 ops
}

double vdpbf16ps_peak_tflops(int threads, double seconds) {
  if (!(detected_features() & kFeatAvx512Bf16)) throw ValueError("this CPU has no AVX512_BF16");
  return instr_rate(bf16_loop, threads, seconds) * 16 * 2 * 2 / 1e12;  // 16 lanes x 2 MACs x 2 ops
}

}  // namespace moe_cpu::bench
