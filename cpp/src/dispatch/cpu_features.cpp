// cpu_features.cpp — feature detection: CPUID + XGETBV on x86-64, getauxval(HWCAP) on AArch64.
#include "moe_cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "moe_cpu/errors.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace moe_cpu {
namespace {

#if defined(__x86_64__) || defined(_M_X64)
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

std::string g_amx_status = "this CPU has no AMX (AMX-TILE, AMX-INT8, AMX-BF16)";

// Linux (5.16+) hands out the 8 KiB tile-data state only on request: ARCH_REQ_XCOMP_PERM (0x1023) for
// XFEATURE_XTILEDATA (18), once per process.
bool request_tile_data() {
  if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) return true;
  const int err = errno;
  g_amx_status = std::string("the kernel refused the tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
                 std::strerror(err) +
                 (err == ENOSPC ? "; a thread's sigaltstack is too small for the tile state"
                                : "; Linux 5.16 or later grants it") + ")";
  return false;
}

// Whether this process already holds the tile-data permission (ARCH_GET_XCOMP_PERM, 0x1022).
bool tile_data_held() {
  uint64_t perm = 0;
  return syscall(SYS_arch_prctl, 0x1022, &perm) == 0 && (perm & (1ull << 18));
}

// The test library tests/amx_trap exports moe_cpu_amx_trap() (what it is) once its SIGILL handler is in.
bool g_amx_emulated = false;
uint64_t amx_trap(uint64_t f) {
  using Describe = const char* (*)();
  const auto describe = reinterpret_cast<Describe>(dlsym(RTLD_DEFAULT, "moe_cpu_amx_trap"));
  const char* what = describe ? describe() : nullptr;
  if (!what) return 0;
  const uint64_t simd = kFeatAmxKernels & ~uint64_t(kFeatAmx);
  if ((f & simd) != simd) {
    g_amx_status += "; the AMX trap library is loaded, but the AMX kernels also need AVX-512 VNNI, BF16 and VBMI";
    return 0;
  }
  g_amx_emulated = true;
  g_amx_status = std::string("emulated: ") + what;
  return kFeatAmx;
}

// Every x86-64 CPU runs the tile model (portable code), pre-AVX ones without XSAVE or CPUID leaf 7 included.
uint64_t detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return kFeatAmxModel;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave) return kFeatAmxModel;
  const uint64_t xcr0 = xgetbv0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & (3u << 17)) == (3u << 17);
  uint64_t f = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return kFeatAmxModel;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned b7 = b, c7 = c, d7 = d;
  __cpuid_count(7, 1, a, b, c, d);
  const unsigned a71 = a;
  if (os_ymm && (b7 & (1u << 5)) && fma && f16c) f |= kFeatAvx2;
  if ((f & kFeatAvx2) && (a71 & (1u << 4))) f |= kFeatAvxVnni;
  const bool avx512 = (b7 & (1u << 16)) && (b7 & (1u << 30)) && (b7 & (1u << 31)) && (b7 & (1u << 17));
  if (os_zmm && avx512 && (f & kFeatAvx2)) f |= kFeatAvx512;
  if ((f & kFeatAvx512) && (c7 & (1u << 11))) f |= kFeatAvx512Vnni;
  if ((f & kFeatAvx512) && (a71 & (1u << 5))) f |= kFeatAvx512Bf16;
  if ((f & kFeatAvx512) && (c7 & (1u << 1))) f |= kFeatAvx512Vbmi;
  const bool cpu_amx = (d7 & (1u << 24)) && (d7 & (1u << 25)) && (d7 & (1u << 22));
  if (cpu_amx && !os_amx) g_amx_status = "the OS does not save the tile state (XCR0 bits 17-18 clear)";
  // The tests' trap comes first: with the tile data never requested, its instructions trap on AMX CPUs too.
  if (!(cpu_amx && os_amx && tile_data_held())) f |= amx_trap(f);
  if (cpu_amx && os_amx && !(f & kFeatAmx) && request_tile_data()) f |= kFeatAmx, g_amx_status = "granted";
  return f | kFeatAmxModel;
}
#elif defined(__aarch64__) && defined(__linux__)
uint64_t detect() {
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  uint64_t f = kFeatNeon;
  if (hw & (1ul << 20)) f |= kFeatNeonDotprod;   // HWCAP_ASIMDDP
  if (hw2 & (1ul << 13)) f |= kFeatNeonI8mm;     // HWCAP2_I8MM
  if (hw2 & (1ul << 14)) f |= kFeatNeonBf16;     // HWCAP2_BF16
  return f;
}
#else
uint64_t detect() { return 0; }
#endif
#if !defined(__x86_64__) && !defined(_M_X64)
const std::string g_amx_status = "AMX is an x86-64 feature";
const bool g_amx_emulated = false;
#endif

struct Level { const char* name; uint64_t mask; };
constexpr uint64_t kAll = ~uint64_t(0) & ~uint64_t(kFeatAmxModel);  // the model only at its own level
constexpr uint64_t kX86 = kAll & ~uint64_t(kFeatNeon | kFeatNeonDotprod | kFeatNeonI8mm | kFeatNeonBf16);
constexpr Level kLevels[] = {
    {"native", kAll},
    {"reference", 0},
    {"avx2", kFeatAvx2},
    {"avx2vnni", kFeatAvx2 | kFeatAvxVnni},
    {"avx512", kX86 & ~uint64_t(kFeatAmx)},
    {"avx512_novbmi", kX86 & ~uint64_t(kFeatAmx | kFeatAvx512Vbmi)},
    {"amx", kX86},
    {"amx_model", kFeatAmxModel},
    {"neon", kFeatNeon},
    {"neon_dotprod", kFeatNeon | kFeatNeonDotprod},
    {"neon_i8mm", kFeatNeon | kFeatNeonDotprod | kFeatNeonI8mm},
    {"neon_bf16", kFeatNeon | kFeatNeonDotprod | kFeatNeonBf16},
};
// The feature an ISA level needs to be present on this CPU.
uint64_t level_requirement(const std::string& n) {
  if (n == "avx2") return kFeatAvx2;
  if (n == "avx2vnni") return kFeatAvxVnni;
  if (n == "avx512" || n == "avx512_novbmi") return kFeatAvx512;
  if (n == "amx") return kFeatAvx512 | kFeatAmx;
  if (n == "amx_model") return kFeatAmxModel;
  if (n == "neon") return kFeatNeon;
  if (n == "neon_dotprod") return kFeatNeonDotprod;
  if (n == "neon_i8mm") return kFeatNeonI8mm;
  if (n == "neon_bf16") return kFeatNeonBf16;
  return 0;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s.empty() ? "none" : s;
}

std::mutex g_mu;
std::atomic<uint64_t> g_mask{kAll};
std::string g_level = "native";
std::once_flag g_env_once;

const Level* find_level(const std::string& n) {
  for (const auto& l : kLevels)
    if (n == l.name) return &l;
  return nullptr;
}

void set_level(const std::string& isa, const char* origin) {
  const Level* l = find_level(isa);
  if (!l) {
    std::string names;
    for (const auto& x : kLevels) names += std::string(names.empty() ? "" : ", ") + x.name;
    throw ValueError(msg(origin, " = '", isa, "' is not an ISA level (expected one of: ", names, ")"));
  }
  const uint64_t need = level_requirement(isa);
  if ((detected_features() & need) != need)
    throw ValueError(msg(origin, " = '", isa, "' needs CPU features this machine lacks (detected: ",
                         join(feature_names(detected_features())), ")",
                         need & kFeatAmx ? "; AMX: " + amx_status() : std::string()));
  std::lock_guard<std::mutex> lock(g_mu);
  g_mask = l->mask;
  g_level = isa;
}

void apply_env() {
  std::call_once(g_env_once, [] {
    const char* env = std::getenv("MOE_CPU_ISA");
    if (env && *env) set_level(env, "MOE_CPU_ISA");
  });
}

}  // namespace

uint64_t detected_features() {
  static const uint64_t f = detect();
  return f;
}

uint64_t active_features() {
  apply_env();
  return detected_features() & g_mask.load();
}

void force_isa(const std::string& isa) {
  apply_env();
  set_level(isa, "isa");
}

std::string forced_isa() {
  apply_env();
  std::lock_guard<std::mutex> lock(g_mu);
  return g_level;
}

std::string amx_status() {
  detected_features();
  return g_amx_status;
}

bool amx_emulated() {
  detected_features();
  return g_amx_emulated;
}

namespace {
std::atomic<int64_t> g_amx_min_rows{0};  // set by set_amx_min_rows; 0: not set (the variable or the defaults)
struct EnvRows {
  int64_t rows = kAmxMinRows;
  bool set = false;
};
const EnvRows& env_rows() {  // MOE_CPU_AMX_MIN_ROWS, read once (a bad value throws at every call)
  static const EnvRows e = [] {
    EnvRows r;
    const char* env = std::getenv("MOE_CPU_AMX_MIN_ROWS");
    if (!env || !*env) return r;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end || v < 1)
      throw ValueError(msg("MOE_CPU_AMX_MIN_ROWS = '", env, "' is not a positive integer (rows an expert needs before the AMX kernels use tiles)"));
    return EnvRows{int64_t(v), true};
  }();
  return e;
}
}  // namespace

int64_t amx_min_rows() {
  const int64_t n = g_amx_min_rows.load(std::memory_order_relaxed);
  return n ? n : env_rows().rows;
}

void set_amx_min_rows(int64_t rows) {
  if (rows < 1) throw ValueError(msg("amx_min_rows = ", rows, " must be >= 1 (rows an expert needs before the AMX kernels use tiles)"));
  g_amx_min_rows.store(rows, std::memory_order_relaxed);
}

void reset_amx_min_rows() { g_amx_min_rows.store(0, std::memory_order_relaxed); }

bool amx_min_rows_set() { return g_amx_min_rows.load(std::memory_order_relaxed) || env_rows().set; }

int64_t amx_min_rows_float() { return amx_min_rows_set() ? amx_min_rows() : kAmxMinRowsFloat; }

std::vector<std::string> feature_names(uint64_t bits) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {kFeatAvx2, "avx2"}, {kFeatAvxVnni, "avx_vnni"}, {kFeatAvx512, "avx512"},
      {kFeatAvx512Vnni, "avx512_vnni"}, {kFeatAvx512Bf16, "avx512_bf16"}, {kFeatAvx512Vbmi, "avx512_vbmi"}, {kFeatAmx, "amx"}, {kFeatAmxModel, "amx_model"},
      {kFeatNeon, "neon"}, {kFeatNeonDotprod, "neon_dotprod"}, {kFeatNeonI8mm, "neon_i8mm"},
      {kFeatNeonBf16, "neon_bf16"}};
  std::vector<std::string> out;
  for (const auto& [bit, name] : kNames)
    if (bits & bit) out.push_back(name);
  return out;
}

}  // namespace moe_cpu
