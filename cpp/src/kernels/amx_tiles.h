// amx_tiles.h — the thin tile interface the AMX kernels are written against, with two backends:
// AmxTiles, the intrinsics (in the ISA region of the word amx only, kernels/isa.h; runs only where
// dispatch found AMX and the OS granted the tile state), and TileModel, a scalar model of the eight
// tile registers written from the pseudo-code of Intel's SDM for each instruction, so that the kernels
// run on every x86 host (the `amx_model` ISA level; a test path, not a speed path).
// A backend offers: configure(cfg) (palette 1, per thread), release(), and per tile number (template
// arguments, as the instructions encode them) load / store / zero and the dot products dpbsud
// (int8: signed A bytes x unsigned B bytes, int32 sums; dpbuud: both unsigned) and dpbf16ps (bf16 pairs, fp32 sums).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef MOE_ISA  // TileConfig and TileModel are portable code, shared by every file that includes this
#include "kernels/isa.h"
#if MOE_ISA_TILES
#include <immintrin.h>
#endif
#endif

namespace moe_cpu::kernels {

// The 64-byte operand of ldtilecfg (palette 1): bytes per row and rows of each tile.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

}  // namespace moe_cpu::kernels

#if defined(MOE_ISA) && MOE_ISA_TILES
MOE_ISA_BEGIN
// The intrinsics take the tile number as a literal (they paste it into the register name): one branch
// per tile, chosen at compile time.
#define MOE_TILE_EACH(t, OP) \
  if constexpr (t == 0) OP(0); else if constexpr (t == 1) OP(1); else if constexpr (t == 2) OP(2); \
  else if constexpr (t == 3) OP(3); else if constexpr (t == 4) OP(4); else if constexpr (t == 5) OP(5); \
  else if constexpr (t == 6) OP(6); else OP(7)
// The dot products the kernels use: C(ra, j) = 2 ra + j from A 4 + ra and B 6 + j.
#define MOE_TILE_DOT(c, a, b, OP) \
  static_assert(c == 2 * (a - 4) + (b - 6) && a >= 4 && a <= 5 && b >= 6 && b <= 7, "C(ra, j) = A(4 + ra) x B(6 + j)"); \
  if constexpr (c == 0) OP(0, 4, 6); else if constexpr (c == 1) OP(1, 4, 7); else if constexpr (c == 2) OP(2, 5, 6); \
  else OP(3, 5, 7)
// GCC 12's _tile_loadconfig tells the compiler that ldtilecfg reads 8 bytes, and _tile_loadd that tileloadd
// reads no memory: the stores of the config's colsb were dropped as dead, and stores to a tile's source
// could move past the load. So configure, load and store are asm here with the whole 64-byte operand or
// a memory clobber; the dot products touch no memory.
struct AmxTiles {
  static constexpr bool kSimdPanels = true;  // int4 / fp8 B tiles by amx_panels_avx512.cpp
  static void configure(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" : : "m"(c)); }
  static void release() { _tile_release(); }
  template <int t> static void load(const void* p, int64_t stride) {
#define MOE_OP(n) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #n : : "r"(p), "r"(stride) : "memory")
    MOE_TILE_EACH(t, MOE_OP);
#undef MOE_OP
  }
  template <int t> static void store(void* p, int64_t stride) {
#define MOE_OP(n) __asm__ volatile("tilestored %%tmm" #n ", (%0,%1,1)" : : "r"(p), "r"(stride) : "memory")
    MOE_TILE_EACH(t, MOE_OP);
#undef MOE_OP
  }
  template <int t> static void zero() {
#define MOE_OP(n) _tile_zero(n)
    MOE_TILE_EACH(t, MOE_OP);
#undef MOE_OP
  }
  template <int c, int a, int b> static void dpbsud() {
#define MOE_OP(x, y, z) _tile_dpbsud(x, y, z)
    MOE_TILE_DOT(c, a, b, MOE_OP);
#undef MOE_OP
  }
  template <int c, int a, int b> static void dpbuud() {  // A16's low bytes (int16_amx.h)
#define MOE_OP(x, y, z) _tile_dpbuud(x, y, z)
    MOE_TILE_DOT(c, a, b, MOE_OP);
#undef MOE_OP
  }
  template <int c, int a, int b> static void dpbf16ps() {
#define MOE_OP(x, y, z) _tile_dpbf16ps(x, y, z)
    MOE_TILE_DOT(c, a, b, MOE_OP);
#undef MOE_OP
  }
};
#undef MOE_TILE_EACH
#undef MOE_TILE_DOT
MOE_ISA_END
#endif

namespace moe_cpu::kernels {

// Tile registers of the calling thread, as the SDM describes them: 16 rows of 64 bytes each, of which
// a configured tile uses rows[t] rows of colsb[t] bytes; every write zeroes the rest of the tile. The
// operations take the tile numbers at run time too (the SIGILL emulator, tests/amx_trap, decodes them).
// What the SDM makes fault (#GP for a bad tile config, #UD for tiles not configured or dot products
// whose shapes do not chain) stops the process with a message, as the CPU would.
struct TileModel {
  static constexpr bool kSimdPanels = false;  // portable code only
  struct State {
    TileConfig cfg;
    bool valid = false;
    alignas(64) uint8_t reg[8][16][64];
  };
  static State& s() {
    thread_local State st;
    return st;
  }
  [[noreturn]] static void fault(const char* insn, const char* why) {
    std::fprintf(stderr, "moe_cpu tile model: %s faults: %s\n", insn, why);
    std::abort();
  }
  // LDTILECFG: palette 0 leaves the tiles unconfigured; palette 1 takes 8 tiles of at most 16 rows x 64
  // bytes, a tile with zero rows or bytes has both zero, the reserved bytes and tiles 8-15 are zero.
  static void configure(const TileConfig& c) {
    if (c.palette > 1) fault("ldtilecfg", "palette > 1");
    for (uint8_t r : c.reserved)
      if (r) fault("ldtilecfg", "reserved bytes 2-15 not zero");
    for (int t = 0; t < 16; ++t) {
      if (t >= 8 && (c.rows[t] || c.colsb[t])) fault("ldtilecfg", "tiles 8-15 configured (palette 1 has 8)");
      if (c.rows[t] > 16 || c.colsb[t] > 64) fault("ldtilecfg", "a tile over 16 rows or 64 bytes per row");
      if (!c.rows[t] != !c.colsb[t]) fault("ldtilecfg", "a tile with rows but no bytes per row, or the reverse");
      if (c.palette == 0 && (c.rows[t] || c.colsb[t])) fault("ldtilecfg", "palette 0 with tile shapes");
    }
    State& st = s();
    st.cfg = c;
    st.valid = c.palette == 1;
    std::memset(st.reg, 0, sizeof st.reg);  // ldtilecfg zeroes the tiles
  }
  static void release() {
    s().valid = false;
    std::memset(s().reg, 0, sizeof s().reg);
  }
  static int rows(int t) { return s().cfg.rows[t]; }
  static int colsb(int t) { return s().cfg.colsb[t]; }
  static void need(const char* insn, int t) {
    if (!s().valid) fault(insn, "tiles not configured (no ldtilecfg, or tilerelease since)");
    if (t < 0 || t > 7 || !rows(t)) fault(insn, "the tile is not configured");
  }
  // write_row_and_zero / zero_upper_rows: row m of tile t from `row` (colsb bytes), the rest zeroed.
  static void write_row(int t, int m, const void* row) {
    std::memset(s().reg[t][m], 0, 64);
    std::memcpy(s().reg[t][m], row, size_t(colsb(t)));
  }
  static void zero_upper_rows(int t) {
    for (int m = rows(t); m < 16; ++m) std::memset(s().reg[t][m], 0, 64);
  }
  static void load(int t, const void* p, int64_t stride) {
    need("tileloadd", t);
    for (int m = 0; m < rows(t); ++m) write_row(t, m, static_cast<const uint8_t*>(p) + m * stride);
    zero_upper_rows(t);
  }
  static void store(int t, void* p, int64_t stride) {
    need("tilestored", t);
    for (int m = 0; m < rows(t); ++m) std::memcpy(static_cast<uint8_t*>(p) + m * stride, s().reg[t][m], size_t(colsb(t)));
  }
  static void zero(int t) {  // the whole register, configured shape or not
    if (!s().valid) fault("tilezero", "tiles not configured");
    std::memset(s().reg[t], 0, sizeof s().reg[t]);
  }
  template <int t> static void load(const void* p, int64_t stride) { load(t, p, stride); }
  template <int t> static void store(void* p, int64_t stride) { store(t, p, stride); }
  template <int t> static void zero() { zero(t); }

  // The loop of every tile dot product in the SDM: for each row m of dst, tmp := dst.row[m]; for
  // k < a.colsb / 4 and n < dst.colsb / 4, cell(tmp[n], the 4 bytes a.row[m].dword[k], b.row[k].dword[n]);
  // then write_row_and_zero(dst, m, tmp) and zero_upper_rows(dst). Cell is int32 or fp32. The shapes
  // must chain (dst rows = a rows, a bytes = 4 x b rows, dst bytes = b bytes) and the tiles differ.
  template <class Cell, class F>
  static void each_dot(const char* insn, int c, int a, int b, F&& cell) {
    need(insn, c), need(insn, a), need(insn, b);
    if (c == a || c == b || a == b) fault(insn, "the three tiles are not distinct");
    if (rows(c) != rows(a) || colsb(a) != 4 * rows(b) || colsb(c) != colsb(b) || colsb(c) % 4 || colsb(a) % 4)
      fault(insn, "tile shapes do not chain: dst rows != src1 rows, src1 bytes != 4 x src2 rows or dst bytes != src2 bytes");
    State& st = s();
    for (int m = 0; m < rows(c); ++m) {
      Cell tmp[16];
      std::memcpy(tmp, st.reg[c][m], 64);
      for (int k = 0; k < colsb(a) / 4; ++k)
        for (int n = 0; n < colsb(c) / 4; ++n) cell(tmp[n], &st.reg[a][m][4 * k], &st.reg[b][k][4 * n]);
      write_row(c, m, tmp);
    }
    zero_upper_rows(c);
  }

  // TDPB[SU][SU]D: tmp.dword[n] += sum over the 4 bytes i of EXTEND(a byte i) * EXTEND(b byte i) (int32,
  // wrapping), each byte sign- or zero-extended as the name says (the kernels use SU, and UU for A16).
  template <bool a_signed, bool b_signed>
  static void dpb(const char* insn, int c, int a, int b) {
    each_dot<uint32_t>(insn, c, a, b, [](uint32_t& t, const uint8_t* x, const uint8_t* y) {
      int32_t dot = 0;
      for (int i = 0; i < 4; ++i)
        dot += (a_signed ? int32_t(int8_t(x[i])) : int32_t(x[i])) * (b_signed ? int32_t(int8_t(y[i])) : int32_t(y[i]));
      t += uint32_t(dot);
    });
  }
  static void dpbsud(int c, int a, int b) { dpb<true, false>("tdpbsud", c, a, b); }
  template <int c, int a, int b> static void dpbsud() { dpbsud(c, a, b); }
  static void dpbuud(int c, int a, int b) { dpb<false, false>("tdpbuud", c, a, b); }
  template <int c, int a, int b> static void dpbuud() { dpbuud(c, a, b); }

  // make_fp32 of a bf16 input with DAZ (denormal inputs read as zero); outputs flushed likewise.
  static float bf16_daz(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    uint32_t u = uint32_t(h) << 16;
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static float ftz(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // TDPBF16PS: tmp.fp32[n] += a.bf16[2k] * b.bf16[2n], then += a.bf16[2k+1] * b.bf16[2n+1], each operation
  // rounded to nearest even with DAZ and FTZ.
  static void dpbf16ps(int c, int a, int b) {
    each_dot<float>("tdpbf16ps", c, a, b, [](float& t, const uint8_t* x, const uint8_t* y) {
      for (int i = 0; i < 2; ++i) t = ftz(t + ftz(bf16_daz(x + 2 * i) * bf16_daz(y + 2 * i)));
    });
  }
  template <int c, int a, int b> static void dpbf16ps() { dpbf16ps(c, a, b); }
};

}  // namespace moe_cpu::kernels
