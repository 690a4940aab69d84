// machine_limits.h — what this machine can do, measured in the same process as the benchmark:
// read bandwidth (AVX-512 / AVX2 aligned loads over huge pages, as the kernels read weights; plain 64-bit loads
// elsewhere) and register-only peaks of the instructions the kernels are made of (inline asm, independent
// accumulators).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moe_cpu::bench {

// A buffer of `bytes` that stays allocated between read_bandwidth calls (first touch done).
struct ReadBuffer;
ReadBuffer* make_read_buffer(size_t bytes);
void free_read_buffer(ReadBuffer* b);
// GB/s of the best of `reps` passes over the whole buffer, `threads` threads each reading a slice.
double read_bandwidth_gbs(ReadBuffer* b, int threads, int reps);

// An instruction (or instruction chain) whose register-only peak the bench can measure.
struct PeakInsn {
  const char* name;    // "vpdpbusd_zmm", "vdpbf16ps_zmm", "vpdpbusd_ymm", "maddubs_ymm", "fma_ymm"
  const char* what;    // the instructions, as a kernel's inner loop issues them
  uint64_t features;   // CpuFeature bits the CPU must have (detected, not the forced level)
  double ops;          // int8 ops or flops per instruction (chain), 2 per multiply-add
};
// Every measurable peak, whether or not this CPU has it.
const std::vector<PeakInsn>& peak_instructions();
// Tera-ops per second of `name` on `threads` threads for about `seconds`. Throws ValueError for an
// unknown name or an instruction this CPU lacks.
double instruction_peak_tops(const std::string& name, int threads, double seconds);

}  // namespace moe_cpu::bench
