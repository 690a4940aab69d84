#!/usr/bin/env python3
"""IQ2_XXS decode at the file's own bits (a row-dot AVX2 kernel compiled here) against moe_cpu's int4 codebook form.

What it builds
    Random IQ2_XXS blocks (every byte pattern is a valid block; d set to a sane fp16) for a Qwen3-30B-A3B-shaped
    block: w13 [E, 2I, H] and w2 [E, H, I] (H 2048, I 768, ``--experts`` E, 128 by default). A prototype kernel,
    compiled here with g++ -O3 -mavx2 -mfma, reads those 66-byte blocks as they are (2.06 bits a weight): per 32
    weights, four grid rows (gguf-py's IQ2_XXS grid, 8 values of 8 / 25 / 43 each) by table, the 7 stored sign bits
    plus the even-parity eighth as a +-1 byte mask on the activations (vpsignb), vpmaddubsw / vpmaddwd, then the
    sub-block's scale d (0.5 + ls) / 4 times the activation block's scale in fp32. The activations are int8 in
    blocks of 32, as moe_cpu's default for the IQ types.

What it times (one thread: the per-core compute rate is what the comparison is about)
    own bits: GEMM1 (gate and up rows), SiLU, the activations of GEMM2 quantized, GEMM2 (down rows) for top-8
    experts, M = 1.
    moe_cpu:  ``fused_experts`` on a block of random int4 codes in groups of 32 with a 16-value signed codebook and
              activation blocks of 32 (the form IQ2_XXS loads as today: ``random_forms`` "iq4_xs"), M = 1.
    Cold: every call routes to 8 experts of a pool that comes back every 16 calls (E = 128 experts do not fit in
    cache); hot: the same 8 experts every call. Medians over rounds that take turns; beside them, the read bandwidth
    of one thread (``ReadBuffer``) in the same rounds. Each side's GB/s counts its own bytes.

Checks
    The kernel's GEMV against float64 of ``gguf.quants.dequantize`` of the same blocks (error of the int8
    activations only, about 1e-2) before timing.

Usage
    python bench/studies/own_bits_decode.py [--experts 128] [--rounds 7]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

H, I, TOP = 2048, 768, 8
BLOCK = 66  # IQ2_XXS bytes per 256 weights

KERNEL = r"""
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <cmath>

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// out[n] = sum over k of W[n, k] * x[k]: W rows of IQ2_XXS blocks (K / 256 a row), x int8 codes with a scale per 32.
static void gemv(const uint8_t* w, int64_t N, int64_t K, const int8_t* xq, const float* xs, const uint64_t* grid,
                 const uint64_t* sgn, float* out) {
  const int64_t nb = K / 256;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = w + n * nb * 66;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* b = row + j * 66;
      _mm_prefetch((const char*)(b + 1024), _MM_HINT_T0);
      uint16_t dh;
      std::memcpy(&dh, b, 2);
      __m256i p[8];
      _Pragma("GCC unroll 8") for (int s = 0; s < 8; ++s) {
        uint64_t qw;
        std::memcpy(&qw, b + 2 + 8 * s, 8);
        const uint32_t aux = uint32_t(qw >> 32);
        const __m256i gv = _mm256_set_epi64x(grid[(qw >> 24) & 255], grid[(qw >> 16) & 255], grid[(qw >> 8) & 255],
                                             grid[qw & 255]);
        const __m256i sv = _mm256_set_epi64x(sgn[(aux >> 21) & 127], sgn[(aux >> 14) & 127], sgn[(aux >> 7) & 127],
                                             sgn[aux & 127]);
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + j * 256 + s * 32));
        p[s] = _mm256_madd_epi16(_mm256_maddubs_epi16(gv, _mm256_sign_epi8(a, sv)), ones);
      }
      // the 8 sub-blocks' sums in one vector, sub-block order
      const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
      const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
      const __m256i sum = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
      // their scales: the aux words (odd dwords of bytes 2..65) >> 28, + 0.5, times d / 4 and the activation scales
      const __m256 v0 = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)));
      const __m256 v1 = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 34)));
      const __m256i aux = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(v0, v1, 0xdd)), 0xd8);
      const __m256 ls = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(aux, 28)), _mm256_set1_ps(0.5f));
      const __m256 sc = _mm256_mul_ps(_mm256_mul_ps(ls, _mm256_set1_ps(half_to_float(dh) * 0.25f)), _mm256_loadu_ps(xs + j * 8));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), sc, acc);
    }
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    out[n] = _mm_cvtss_f32(v);
  }
}

// int8 codes of x[K] in blocks of 32 (scale amax / 127).
static void quantize(const float* x, int64_t K, int8_t* q, float* s) {
  for (int64_t b = 0; b < K / 32; ++b) {
    float m = 0.f;
    for (int i = 0; i < 32; ++i) m = std::fmax(m, std::fabs(x[b * 32 + i]));
    const float sc = m / 127.f, inv = m > 0.f ? 127.f / m : 0.f;
    s[b] = sc;
    for (int i = 0; i < 32; ++i) q[b * 32 + i] = int8_t(std::nearbyint(x[b * 32 + i] * inv));
  }
}

extern "C" {
void iq2xxs_gemv(const uint8_t* w, int64_t N, int64_t K, const float* x, const uint64_t* grid, const uint64_t* sgn,
                 float* out) {
  int8_t xq[8192];
  float xs[256];
  quantize(x, K, xq, xs);
  gemv(w, N, K, xq, xs, grid, sgn, out);
}
// One token through experts ids[TOP]: w13 rows [E][2I][H / 256 blocks], w2 [E][H][I / 256], out[H] summed (weights
// 1 / TOP), one thread.
void iq2xxs_moe_decode(const uint8_t* w13, const uint8_t* w2, int64_t H, int64_t I, const int32_t* ids, int64_t top,
                       const float* x, const uint64_t* grid, const uint64_t* sgn, float* out) {
  alignas(32) int8_t xq[8192], hq[8192];
  float xs[256], hs[256], gu[16384], h[8192], y[8192];
  quantize(x, H, xq, xs);
  const int64_t b13 = 2 * I * (H / 256) * 66, b2 = H * (I / 256) * 66;
  for (int64_t i = 0; i < H; ++i) out[i] = 0.f;
  for (int64_t t = 0; t < top; ++t) {
    gemv(w13 + ids[t] * b13, 2 * I, H, xq, xs, grid, sgn, gu);
    for (int64_t i = 0; i < I; ++i) h[i] = gu[i] / (1.f + std::exp(-gu[i])) * gu[I + i];
    quantize(h, I, hq, hs);
    gemv(w2 + ids[t] * b2, H, I, hq, hs, grid, sgn, y);
    for (int64_t i = 0; i < H; ++i) out[i] += y[i] * (1.f / float(top));
  }
}
}
"""


def die(msg: str) -> None:
    print(f"own_bits_decode.py: {msg}", file=sys.stderr)
    sys.exit(2)


def tables():
    """gguf-py's IQ2_XXS grid as uint64 rows of 8 bytes, and the 128 sign masks (7 bits + even parity, +-1 bytes)."""
    import gguf.quants as gq

    gq.IQ2_XXS.init_grid()
    g = np.asarray(gq.IQ2_XXS.grid, np.float32).reshape(256, 8).astype(np.uint8)
    grid = g.view(np.uint64).ravel().copy()
    s = np.zeros((128, 8), np.int8)
    for v in range(128):
        bits = [(v >> i) & 1 for i in range(7)]
        bits.append(sum(bits) & 1)
        s[v] = [-1 if b else 1 for b in bits]
    return grid, s.view(np.uint64).ravel().copy(), g.astype(np.float64)


def random_blocks(rng, E: int, N: int, K: int) -> np.ndarray:
    b = rng.integers(0, 256, (E, N, K // 256, BLOCK), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.0, (E, N, K // 256)) * 2.0 ** -8).astype(np.float16)
    b[..., 0:2] = d.view(np.uint8).reshape(E, N, K // 256, 2)
    return b


def build_kernel(workdir: str) -> ctypes.CDLL:
    src, lib = os.path.join(workdir, "k.cpp"), os.path.join(workdir, "k.so")
    with open(src, "w") as f:
        f.write(KERNEL)
    cmd = ["g++", "-O3", "-mavx2", "-mfma", "-mf16c", "-fPIC", "-shared", src, "-o", lib]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed: {p.stderr.strip()[-300:]}")
    return ctypes.CDLL(lib)


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=128, help="experts in the block (default 128; >= 8)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    ap.add_argument("--calls", type=int, default=64, help="calls per round and side (default 64)")
    args = ap.parse_args(argv)
    if args.experts < TOP or args.rounds < 1 or args.calls < 1:
        die(f"--experts must be >= {TOP}, --rounds and --calls >= 1")
    if not shutil.which("g++"):
        die("needs g++")
    try:
        import gguf.quants  # noqa: F401
    except ImportError:
        die("needs gguf-py (pip install gguf)")
    import moe_cpu as mc

    if "avx2" not in mc.cpu_features()["detected"]:
        die("needs an AVX2 host")
    from moe_cpu.bench.random_forms import random_block

    mc.set_num_threads(1)
    rng = np.random.default_rng(0)
    grid, sgn, g64 = tables()
    E = args.experts
    w13 = random_blocks(rng, E, 2 * I, H)
    w2 = random_blocks(rng, E, H, I)
    with tempfile.TemporaryDirectory() as td:
        lib = build_kernel(td)
        lib.iq2xxs_gemv.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 4
        lib.iq2xxs_moe_decode.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 4

        # the GEMV against float64 of gguf-py's dequantization (expert 0's gate / up rows)
        import gguf.quants as gq

        x = rng.standard_normal(H).astype(np.float32)
        wd = gq.dequantize(w13[0].reshape(2 * I, -1), gq.GGMLQuantizationType.IQ2_XXS).astype(np.float64)
        got = np.zeros(2 * I, np.float32)
        lib.iq2xxs_gemv(ptr(w13[0]), 2 * I, H, ptr(x), ptr(grid), ptr(sgn), ptr(got))
        want = wd @ x.astype(np.float64)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        print(f"own-bits GEMV against float64 of gguf.quants.dequantize: rel L2 {err:.2e}")
        if not err < 3e-2:
            die(f"the prototype kernel is wrong (rel L2 {err:.2e})")

        b13, b2 = random_block(rng, "iq4_xs", H, I, E)
        own_bytes = TOP * (w13[0].nbytes + w2[0].nbytes)
        mc_bytes = TOP * (b13.nbytes + b2.nbytes) // E
        pools = [rng.permutation(E)[:TOP].astype(np.int32) for _ in range(16)]
        xs = [rng.standard_normal((1, H)).astype(np.float32) for _ in range(16)]
        out = np.zeros(H, np.float32)
        rb = mc._core.ReadBuffer(1 << 30)

        def own(i, hot):
            ids = pools[0 if hot else i % 16]
            lib.iq2xxs_moe_decode(ptr(w13), ptr(w2), H, I, ptr(ids), TOP, ptr(xs[i % 16]), ptr(grid), ptr(sgn), ptr(out))

        tw = np.full((1, TOP), 1.0 / TOP, np.float32)

        def ours(i, hot):
            ids = pools[0 if hot else i % 16][None, :]
            mc.fused_experts(xs[i % 16], b13, b2, tw, ids)

        def timed(fn, hot):
            for i in range(4):
                fn(i, hot)
            t = []
            for i in range(args.calls):
                t0 = time.perf_counter()
                fn(i, hot)
                t.append(time.perf_counter() - t0)
            return float(np.median(t))

        rows = {k: [] for k in ("own cold", "mc cold", "own hot", "mc hot", "bw")}
        for r in range(args.rounds):
            order = [("own", own), ("mc", ours)] if r % 2 == 0 else [("mc", ours), ("own", own)]
            for hot in (False, True):
                for name, fn in order:
                    rows[f"{name} {'hot' if hot else 'cold'}"].append(timed(fn, hot))
            rows["bw"].append(rb.read_gbs(1, 2))
        med = {k: float(np.median(v)) for k, v in rows.items()}
        print(f"one thread, M = 1, top-{TOP} of {E} experts, H {H}, I {I}; {args.rounds} rounds of {args.calls} calls")
        print(f"bytes per token: own bits {own_bytes / 2**20:.2f} MiB (2.06 bits a weight), "
              f"moe_cpu int4 codebook form {mc_bytes / 2**20:.2f} MiB ({8 * mc_bytes / (TOP * 3 * H * I):.2f} bits)")
        for k in ("cold", "hot"):
            o, m = med[f"own {k}"], med[f"mc {k}"]
            print(f"  {k:4s}: own bits {o * 1e3:7.3f} ms ({own_bytes / o / 1e9:5.1f} GB/s)   moe_cpu {m * 1e3:7.3f} ms "
                  f"({mc_bytes / m / 1e9:5.1f} GB/s)   own / moe_cpu {o / m:.2f}")
        print(f"  read bandwidth, one thread, same rounds: {med['bw']:.1f} GB/s")


if __name__ == "__main__":
    main()
