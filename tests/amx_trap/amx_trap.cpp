// amx_trap.cpp — a test library that runs AMX code on x86-64 CPUs without AMX. Loaded (LD_PRELOAD) into a
// test process, it installs a SIGILL handler that decodes the AMX instruction at the faulting address,
// executes it on the scalar tile model of kernels/amx_tiles.h (the thread's own tile registers, with the
// model's #GP / #UD checks), and steps over it. moe_cpu's dispatch finds moe_cpu_amx_trap() and grants
// AMX as "emulated", so the amx kernels run their real compiled code (intrinsics, tile configs, strides,
// the AVX-512 panel code) on any host with AVX-512. A test path: every tile instruction is a signal.
// Decoded: VEX map 0F38 W0 L0 — 49 (ldtilecfg, sttilecfg, tilerelease, tilezero), 4B (tileloadd,
// tileloaddt1, tilestored; SIB: base + disp is the first row, index << scale the stride), 5E (tdpbssd,
// tdpbsud, tdpbusd, tdpbuud) and 5C (tdpbf16ps). Anything else gets the default SIGILL back.
// On a CPU with AMX, dispatch then leaves the tile data unrequested (arch_prctl), so the tile-data
// instructions trap there too; ldtilecfg, sttilecfg and tilerelease run in hardware (see sync_native_config).
#include <cpuid.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "kernels/amx_tiles.h"

namespace {
using moe_cpu::kernels::TileConfig;
using moe_cpu::kernels::TileModel;

// ModRM / SIB register numbers 0-15 (rax ... r15) to the saved general registers.
constexpr int kGreg[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                           REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

struct Insn {
  int len = 0;
  uint8_t op = 0, pp = 0;
  bool mem = false, sib = false;
  int reg = 0, rm = 0, vvvv = 0;  // tile numbers (reg and rm with their VEX extension bits)
  uint64_t addr = 0;              // memory operand: base + index << scale + disp (RIP-relative as given)
  uint64_t base_disp = 0, stride = 0;
};

// Decodes the VEX-encoded AMX instruction at p; false if it is not one.
bool decode(const uint8_t* p, const greg_t* g, Insn& in) {
  if (p[0] != 0xC4) return false;
  const uint8_t b1 = p[1], b2 = p[2];
  if ((b1 & 0x1f) != 2 || (b2 & 0x84)) return false;  // map 0F38, W0, L0
  const int R = !(b1 & 0x80), X = !(b1 & 0x40), B = !(b1 & 0x20);
  in.pp = b2 & 3, in.vvvv = (~b2 >> 3) & 15, in.op = p[3];
  const uint8_t modrm = p[4];
  const int mod = modrm >> 6;
  in.reg = ((modrm >> 3) & 7) | R << 3, in.rm = (modrm & 7) | B << 3;
  int n = 5;
  if (mod == 3) {
    in.len = n;
    return true;
  }
  in.mem = true;
  int64_t base = 0, index = 0, disp = 0;
  bool rip = false;
  if ((modrm & 7) == 4) {
    in.sib = true;
    const uint8_t sib = p[n++];
    const int scale = sib >> 6, idx = ((sib >> 3) & 7) | X << 3, bs = (sib & 7) | B << 3;
    if (idx != 4) index = int64_t(uint64_t(g[kGreg[idx]]) << scale);
    if ((sib & 7) == 5 && mod == 0) {
      std::memcpy(&disp, p + n, 4), disp = int32_t(disp), n += 4;  // no base
    } else {
      base = g[kGreg[bs]];
    }
  } else if ((modrm & 7) == 5 && mod == 0) {
    rip = true;
  } else {
    base = g[kGreg[in.rm]];
  }
  if (mod == 1) disp = int8_t(p[n++]);
  if (mod == 2 || rip) {
    int32_t d;
    std::memcpy(&d, p + n, 4), disp = d, n += 4;
  }
  in.len = n;
  if (rip) base = int64_t(uint64_t(g[REG_RIP]) + uint64_t(n));
  in.base_disp = uint64_t(base + disp);
  in.stride = uint64_t(index);
  in.addr = uint64_t(base + index + disp);
  return true;
}

// Runs a decoded instruction on the model; false if it is not an AMX instruction this library knows.
bool execute(const Insn& in) {
  const bool tiles_ok = in.reg < 8 && (in.mem || in.rm < 8) && in.vvvv < 8;
  if (in.op == 0x49) {
    if (in.pp == 0 && in.mem && in.reg == 0 && in.vvvv == 0) {  // ldtilecfg m512
      TileConfig c;
      std::memcpy(&c, reinterpret_cast<const void*>(in.addr), sizeof c);
      TileModel::configure(c);
      return true;
    }
    if (in.pp == 1 && in.mem && in.reg == 0 && in.vvvv == 0) {  // sttilecfg m512
      TileConfig c{};
      c.palette = 0;
      if (TileModel::s().valid) c = TileModel::s().cfg;
      std::memcpy(reinterpret_cast<void*>(in.addr), &c, sizeof c);
      return true;
    }
    if (in.pp == 0 && !in.mem && in.reg == 0 && in.rm == 0 && in.vvvv == 0) return TileModel::release(), true;
    if (in.pp == 3 && !in.mem && in.rm == 0 && in.vvvv == 0 && tiles_ok) return TileModel::zero(in.reg), true;
    return false;
  }
  if (in.op == 0x4B && in.mem && in.sib && in.vvvv == 0 && tiles_ok) {
    void* row0 = reinterpret_cast<void*>(in.base_disp);
    if (in.pp == 3 || in.pp == 1) return TileModel::load(in.reg, row0, int64_t(in.stride)), true;  // tileloadd[t1]
    if (in.pp == 2) return TileModel::store(in.reg, row0, int64_t(in.stride)), true;                 // tilestored
    return false;
  }
  if (in.mem || !tiles_ok) return false;
  const int c = in.reg, a = in.rm, b = in.vvvv;  // dst (ModRM.reg), src1 (ModRM.rm), src2 (VEX.vvvv)
  if (in.op == 0x5E) {
    switch (in.pp) {
      case 3: return TileModel::dpb<true, true>("tdpbssd", c, a, b), true;
      case 2: return TileModel::dpb<true, false>("tdpbsud", c, a, b), true;
      case 1: return TileModel::dpb<false, true>("tdpbusd", c, a, b), true;
      default: return TileModel::dpb<false, false>("tdpbuud", c, a, b), true;
    }
  }
  if (in.op == 0x5C && in.pp == 2) return TileModel::dpbf16ps(c, a, b), true;
  return false;
}

std::atomic<uint64_t> g_executed{0};  // tile instructions run on the model (moe_cpu_amx_trap_count)
struct sigaction g_prev {};  // the handler before ours: it gets every SIGILL that is not a decoded AMX one

// Where TILECFG (XSAVE component 17) sits in a signal frame's XSAVE area (standard format); 0: not an AMX CPU.
uint32_t tilecfg_offset() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 0xd) return 0;
  __cpuid_count(7, 0, a, b, c, d);
  if (!(d & (1u << 24))) return 0;  // AMX-TILE
  __cpuid_count(0xd, 17, a, b, c, d);
  return a == sizeof(TileConfig) ? b : 0;
}
const uint32_t g_tilecfg_offset = tilecfg_offset();

// On an AMX CPU, ldtilecfg runs in hardware, unseen. A config it loaded since the last trap is in the signal
// frame (TILECFG, marked in XSTATE_BV): the model takes it (zeroing the tiles, as ldtilecfg does) and the frame
// marks TILECFG as init, so the hardware is unconfigured again after the handler and the next ldtilecfg shows.
void sync_native_config(ucontext_t* uc) {
  auto* x = reinterpret_cast<uint8_t*>(uc->uc_mcontext.fpregs);
  if (!g_tilecfg_offset || !x) return;
  struct { uint32_t magic1, extended_size; uint64_t xfeatures; uint32_t xstate_size; } sw;  // _fpx_sw_bytes
  std::memcpy(&sw, x + 464, sizeof sw);
  constexpr uint64_t kTileCfg = 1ull << 17;
  if (sw.magic1 != 0x46505853u || !(sw.xfeatures & kTileCfg) ||
      g_tilecfg_offset + sizeof(TileConfig) > sw.xstate_size)
    return;
  uint64_t bv;
  std::memcpy(&bv, x + 512, sizeof bv);  // the XSAVE header's XSTATE_BV
  if (!(bv & kTileCfg)) return;
  TileConfig c;
  std::memcpy(&c, x + g_tilecfg_offset, sizeof c);
  TileModel::configure(c);
  bv &= ~kTileCfg;
  std::memcpy(x + 512, &bv, sizeof bv);
}

void on_sigill(int sig, siginfo_t* info, void* ctx) {
  auto* uc = static_cast<ucontext_t*>(ctx);
  greg_t* g = uc->uc_mcontext.gregs;
  Insn in;
  const bool decoded = decode(reinterpret_cast<const uint8_t*>(g[REG_RIP]), g, in);
  if (decoded) sync_native_config(uc);
  if (decoded && execute(in)) {
    g[REG_RIP] += in.len;
    g_executed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  static const char kMsg[] = "moe_cpu amx_trap: SIGILL at an instruction that is not a decoded AMX one\n";
  (void)!write(2, kMsg, sizeof kMsg - 1);
  if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction) return g_prev.sa_sigaction(sig, info, ctx);
  if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) return g_prev.sa_handler(sig);
  signal(sig, SIG_DFL);  // returning re-executes it and dies as it would without this library
}

// Puts the handler on top (again: Python's faulthandler, enabled by pytest, replaces it), keeping the
// previous one for the SIGILLs that are not AMX instructions.
bool install() {
  struct sigaction sa {}, old {};
  sa.sa_sigaction = on_sigill;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGILL, &sa, &old) != 0) return false;
  if (old.sa_sigaction != on_sigill) g_prev = old;
  return true;
}

const bool g_installed = install();

}  // namespace

// Called by moe_cpu's feature detection (once per process, at its first dispatch).
extern "C" __attribute__((visibility("default"))) const char* moe_cpu_amx_trap() {
  if (!g_installed || !install()) return nullptr;
  return g_tilecfg_offset ? "the tests' SIGILL trap (tests/amx_trap) runs each tile-data instruction on the scalar tile "
                            "model (tile data left unrequested on this AMX CPU)"
                          : "the tests' SIGILL trap (tests/amx_trap) runs each tile instruction on the scalar tile model";
}

// Tile instructions this process has run through the trap (tests: whether a call took the tiles).
extern "C" __attribute__((visibility("default"))) uint64_t moe_cpu_amx_trap_count() {
  return g_executed.load(std::memory_order_relaxed);
}
