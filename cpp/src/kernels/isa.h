// isa.h — where ISA code lives: the ISA region of a kernel header (cpp/src/kernels/README.md, "ISA regions").
// No file is compiled with ISA flags. A kernel .cpp names its ISA word first (`#define MOE_ISA avx2`), then
// includes its kernel headers; each opens MOE_ISA_BEGIN after its #includes and closes MOE_ISA_END at its
// end. Between them the code is compiled for the word's target and lies in namespace
// moe_cpu::kernels::<word>, so nothing it defines can be the copy the linker keeps for another ISA or for
// portable code. What the region calls from outside it (the standard library, common/, moe/) is compiled
// for the baseline in every file, ISA files included. A using-directive after each region lets the file
// write kernels::name. scripts/isa_audit.py reads the words below and checks the built objects.
#pragma once

#ifndef MOE_ISA
#error "define MOE_ISA (the file's ISA word, kernels/isa.h) before including a kernel header"
#endif

// The target of each word (what `#pragma GCC target` takes), applied to X; a word without one is the baseline.
#define MOE_ISA_TARGET_portable(X)
#define MOE_ISA_TARGET_avx2(X) X("avx2,fma,f16c")
#define MOE_ISA_TARGET_avx2vnni(X) X("avx2,fma,f16c,avxvnni")
#define MOE_ISA_TARGET_avx2vnni_evex(X) X("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")
#define MOE_ISA_TARGET_avx512(X) X("avx512f,avx512bw,avx512vl,avx512dq,fma")
#define MOE_ISA_TARGET_avx512vnni(X) X("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")
#define MOE_ISA_TARGET_avx512bf16(X) X("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#define MOE_ISA_TARGET_avx512vbmi(X) X("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx512vbmi")
#define MOE_ISA_TARGET_amx(X) X("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx512vbmi,avx512vnni,amx-tile,amx-int8,amx-bf16")
#define MOE_ISA_TARGET_amx_model(X)
#define MOE_ISA_TARGET_neon(X)
#define MOE_ISA_TARGET_neon_dotprod(X) X("arch=armv8.2-a+dotprod")
#define MOE_ISA_TARGET_neon_i8mm(X) X("arch=armv8.2-a+i8mm")
#define MOE_ISA_TARGET_neon_bf16(X) X("arch=armv8.2-a+bf16")
// Words whose region holds the real tile instructions (amx_tiles.h's AmxTiles).
#define MOE_ISA_TILES_amx 1

#define MOE_ISA_CAT_(a, b) a##b
#define MOE_ISA_CAT(a, b) MOE_ISA_CAT_(a, b)
#define MOE_ISA_TARGET MOE_ISA_CAT(MOE_ISA_TARGET_, MOE_ISA)
#define MOE_ISA_TILES MOE_ISA_CAT(MOE_ISA_TILES_, MOE_ISA)
#define MOE_ISA_PRAGMA_(x) _Pragma(#x)
#define MOE_ISA_PRAGMA(x) MOE_ISA_PRAGMA_(x)

#if defined(__clang__)  // the same region with clang's attribute stack
#define MOE_ISA_PUSH(s) MOE_ISA_PRAGMA(clang attribute push(__attribute__((target(s))), apply_to = function))
#define MOE_ISA_POP(s) MOE_ISA_PRAGMA(clang attribute pop)
#define MOE_ISA_BEGIN MOE_ISA_TARGET(MOE_ISA_PUSH) namespace moe_cpu::kernels::MOE_ISA {
#define MOE_ISA_END_PRAGMA MOE_ISA_TARGET(MOE_ISA_POP)
#else
#define MOE_ISA_PUSH(s) MOE_ISA_PRAGMA(GCC target(s))
#define MOE_ISA_BEGIN MOE_ISA_PRAGMA(GCC push_options) MOE_ISA_TARGET(MOE_ISA_PUSH) namespace moe_cpu::kernels::MOE_ISA {
#define MOE_ISA_END_PRAGMA MOE_ISA_PRAGMA(GCC pop_options)
#endif
#define MOE_ISA_END                     \
  }                                     \
  MOE_ISA_END_PRAGMA                    \
  namespace moe_cpu::kernels {          \
  using namespace MOE_ISA;              \
  }
