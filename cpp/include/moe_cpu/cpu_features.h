// cpu_features.h — CPU feature bits, detected once (CPUID+XGETBV / HWCAP) and maskable for tests.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moe_cpu {

enum CpuFeature : uint64_t {
  kFeatAvx2 = 1u << 0,        // AVX2 + FMA + F16C, OS saves YMM
  kFeatAvxVnni = 1u << 1,     // AVX-VNNI (VEX vpdpbusd)
  kFeatAvx512 = 1u << 2,      // AVX512F + BW + VL + DQ, OS saves ZMM
  kFeatAvx512Vnni = 1u << 3,
  kFeatAvx512Bf16 = 1u << 4,
  kFeatAmx = 1u << 5,         // AMX-TILE + INT8 + BF16, OS saves the tile state and granted it (arch_prctl)
  kFeatAvx512Vbmi = 1u << 6,  // byte permutes (vpermt2b)
  kFeatAmxModel = 1u << 7,    // the AMX kernels on the scalar tile model: every x86 host, active only at level amx_model
  kFeatNeon = 1u << 8,
  kFeatNeonDotprod = 1u << 9,
  kFeatNeonI8mm = 1u << 10,
  kFeatNeonBf16 = 1u << 11,
};
// What the AMX kernels need: the tiles, and the AVX-512 their files are compiled for (every AMX CPU has it).
constexpr uint64_t kFeatAmxKernels = kFeatAvx512 | kFeatAvx512Vnni | kFeatAvx512Bf16 | kFeatAvx512Vbmi | kFeatAmx;

// Features detected on this CPU (never masked).
uint64_t detected_features();
// Features that dispatch may use: detected & the mask set by MOE_CPU_ISA or force_isa().
uint64_t active_features();
// Restricts dispatch to an ISA level: "native" (no mask), "reference" (no SIMD), "avx2" (AVX2 + FMA,
// no AVX-VNNI), "avx2vnni" (AVX2 + AVX-VNNI), "avx512", "avx512_novbmi" (AVX-512 without VBMI, as
// on Cooper Lake), "neon", "neon_dotprod", "neon_i8mm", "neon_bf16". Throws ValueError for unknown
// names or for a level this CPU lacks. "amx": AVX-512 and AMX (the avx512 levels exclude AMX);
// "amx_model": the AMX kernels on the scalar tile model (any x86 host; a test path). Affects kernels chosen at later pack time only.
void force_isa(const std::string& isa);
// The current ISA level name ("native" unless forced).
std::string forced_isa();
// "granted" when dispatch may use AMX, else why not (no AMX in CPUID, the OS does not save the tile
// state, or the kernel refused the tile-data permission); "emulated: ..." where the CPU lacks AMX and the
// test library tests/amx_trap (a SIGILL handler that runs each tile instruction on the scalar tile model)
// is loaded: then kFeatAmx is set, the amx kernels run their real code, and no speed means anything.
std::string amx_status();
bool amx_emulated();
// Rows an expert needs before the AMX kernels use the tiles; with fewer, their AVX-512 twins run (the
// int schemes give the same bits either way). Set by set_amx_min_rows, else MOE_CPU_AMX_MIN_ROWS (a
// positive integer, read once; ValueError else), else kAmxMinRows. Until one of the two sets it, bf16 and fp8
// take the tiles from kAmxMinRowsFloat rows. The forms whose tiles lost where measured (kernels/amx_scratch.h:
// tiles_lose) stay on the twins unless the threshold is set to 1 (every expert on the tiles: the tests).
// kAmxMinRows: measured on a 16-core Emerald Rapids (docs/performance.md,
// "Xeon with AMX: when the tiles win (2 and 16 cores)").
constexpr int64_t kAmxMinRows = 16;
constexpr int64_t kAmxMinRowsFloat = 8;  // bf16 / fp8: 1.37-2.18x at 8 rows on a 16- and a 2-core Emerald Rapids
int64_t amx_min_rows();
int64_t amx_min_rows_float();  // bf16 / fp8's threshold in force: amx_min_rows() once set, else kAmxMinRowsFloat
bool amx_min_rows_set();  // by set_amx_min_rows or MOE_CPU_AMX_MIN_ROWS
void set_amx_min_rows(int64_t rows);  // rows >= 1, else ValueError
void reset_amx_min_rows();  // back to MOE_CPU_AMX_MIN_ROWS or, without it, the defaults (not set)
// Names of the active feature bits, e.g. {"avx2", "avx512", "avx512_vnni"}.
std::vector<std::string> feature_names(uint64_t bits);

}  // namespace moe_cpu
