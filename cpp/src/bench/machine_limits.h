// machine_limits.h — what this machine can do, measured in the same process as the benchmark:
// read bandwidth with AVX-512 (or AVX2) streaming loads, and register-only peaks of vpdpbusd
// and vdpbf16ps (16 independent zmm accumulators, inline asm). Throws ValueError when the CPU
// lacks the instructions.
#pragma once
#include <cstddef>

namespace moe_cpu::bench {

// A buffer of `bytes` that stays allocated between read_bandwidth calls (first touch done).
struct ReadBuffer;
ReadBuffer* make_read_buffer(size_t bytes);
void free_read_buffer(ReadBuffer* b);
// GB/s of the best of `reps` passes over the whole buffer, `threads` threads each reading a slice.
double read_bandwidth_gbs(ReadBuffer* b, int threads, int reps);
// Int8 ops/s (2 per multiply-add) of vpdpbusd zmm, in TOPS; bf16 flops/s of vdpbf16ps zmm, in TFLOPS.
double vpdpbusd_peak_tops(int threads, double seconds);
double vdpbf16ps_peak_tflops(int threads, double seconds);

}  // namespace moe_cpu::bench
