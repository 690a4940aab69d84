// fma_pipe_share.cpp — which instructions compete with vpdpbusd for issue slots (docs/performance.md,
// GGUF weight forms). 12 independent vpdpbusd per iteration, alone and with 3 more instructions of
// one kind; an added kind that lengthens the iteration shares vpdpbusd's pipes.
//   g++ -O2 -mavx512f -mavx512vnni bench/fma_pipe_share.cpp -o /tmp/fma_pipe_share && /tmp/fma_pipe_share
#include <chrono>
#include <cstdio>

#define DP(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n"
#define DP12 DP(0) DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11)
#define LOOP(name, extra)                                                        \
  static double name(long n) {                                                   \
    const auto t0 = std::chrono::steady_clock::now();                            \
    for (long i = 0; i < n; ++i) asm volatile(DP12 extra ::: "memory");          \
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(n) * 1e9; \
  }
#define X3(op) op "%%zmm30, %%zmm31, %%zmm12\n" op "%%zmm30, %%zmm31, %%zmm13\n" op "%%zmm30, %%zmm31, %%zmm14\n"
LOOP(alone, "")
LOOP(with_fma, X3("vfmadd231ps "))
LOOP(with_pmulld, X3("vpmulld "))
LOOP(with_dpwssd, X3("vpdpwssd "))
LOOP(with_paddd, X3("vpaddd "))
LOOP(with_cvt, "vcvtdq2ps %%zmm30, %%zmm12\n vcvtdq2ps %%zmm31, %%zmm13\n vcvtdq2ps %%zmm29, %%zmm14\n")

int main() {
  const long n = 50000000;
  for (int rep = 0; rep < 2; ++rep)
    std::printf("ns per iteration: 12 vpdpbusd %.3f | +3 vfmadd231ps %.3f | +3 vpmulld %.3f | +3 vpdpwssd %.3f | "
                "+3 vpaddd %.3f | +3 vcvtdq2ps %.3f\n",
                alone(n), with_fma(n), with_pmulld(n), with_dpwssd(n), with_paddd(n), with_cvt(n));
}
