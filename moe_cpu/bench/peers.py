"""Peers run in the same process: the Eigen reference path, NumPy float32 and (where installed) torch."""
from __future__ import annotations

import os
import sys

import numpy as np

from .. import api
from .random_forms import random_packed
from .shapes import SHAPES
from .timing import timed


def numpy_peer(x, w13f, w2f, tw, ids):
    """The NumPy float32 layer: per-expert matmuls on dequantized weights (the peer run in-process)."""
    I = w2f.shape[2]
    out = np.zeros((x.shape[0], w2f.shape[1]), np.float32)
    for e in np.unique(ids):
        rows, cols = np.nonzero(ids == e)
        y = x[rows] @ w13f[e].T
        with np.errstate(over="ignore"):  # random weights: exp(-g) may overflow to inf, silu -> 0
            h = y[:, :I] / (1 + np.exp(-y[:, :I])) * y[:, I:]
        np.add.at(out, rows, (h @ w2f[e].T) * tw[rows, cols][:, None])
    return out


def peers(args, rng):
    """Qwen3 shape: the dispatched kernel against the Eigen reference path and NumPy float32."""
    H, I, _, k, E, _ = SHAPES["qwen3-30b-a3b"]
    rows = []
    print("\npeers (qwen3-30b-a3b shape): ms per call")
    print(f"{'scheme':<10} {'M':>5} {'simd':>9} {'reference':>10} {'numpy f32':>10} {'x ref':>7} {'x numpy':>8}")
    for scheme in args.schemes:
        w13, w2 = random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
        api.force_isa("reference")
        r13, r2 = random_packed(np.random.default_rng(1), scheme, E, 2 * I, H), random_packed(np.random.default_rng(1), scheme, E, H, I)
        api.force_isa(os.environ.get("MOE_CPU_ISA") or "native")
        f13, f2 = w13.unpack(), w2.unpack()
        for M in (1, 64):
            x = rng.standard_normal((M, H), dtype=np.float32)
            tw = np.full((M, k), 1.0 / k, np.float32)
            ids = np.ascontiguousarray(np.argsort(rng.random((M, E)), axis=1)[:, :k], dtype=np.int32)
            t_simd = timed(lambda: api.fused_experts(x, w13, w2, tw, ids), 0.3)
            t_ref = timed(lambda: api.fused_experts(x, r13, r2, tw, ids), 0.3, 3)
            t_np = timed(lambda: numpy_peer(x, f13, f2, tw, ids), 0.3, 5)
            rows.append(dict(scheme=scheme, M=M, simd_ms=t_simd * 1e3, reference_ms=t_ref * 1e3, numpy_ms=t_np * 1e3,
                             kernel=w13.kernel, reference_kernel=r13.kernel))
            print(f"{scheme:<10} {M:>5} {t_simd * 1e3:>9.2f} {t_ref * 1e3:>10.2f} {t_np * 1e3:>10.2f} "
                  f"{t_ref / t_simd:>7.1f} {t_np / t_simd:>8.1f}")
        del w13, w2, r13, r2, f13, f2
    return rows


def import_torch(peer, threads):
    """torch on `threads` threads, or None after a line saying how to get it (a bench-only dependency)."""
    try:
        import torch
    except ImportError:
        print(f"\n{peer}: torch is not installed (pip install torch==2.13.0 takes the CPU wheel)")
        return None
    torch.set_num_threads(threads)
    return torch


def torch_peer(rng, threads, ms=(1, 1024)):
    """Qwen3 shape, bf16 scheme against torch on the CPU: a vLLM-style loop over the experts (gather
    the expert's rows, linear, SiLU and mul, linear, router weight, index_add) on the same weights as
    fp32 and as bf16 tensors. Runs where torch is installed."""
    # torch held to the same tier as a forced ISA level (its own variables, unless set; they are
    # read when torch is imported, so not when it already was).
    level = api.cpu_features()["isa"]
    held = {"avx2": ("avx2", "AVX2"), "avx2vnni": ("avx2", "AVX2_VNNI"), "reference": ("default", "SSE41")}.get(level)
    held = None if "torch" in sys.modules else held
    if held:
        os.environ.setdefault("ATEN_CPU_CAPABILITY", held[0])
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", held[1])
    torch = import_torch("torch peer", threads)
    if torch is None:
        return []
    H, I, _, k, E, _ = SHAPES["qwen3-30b-a3b"]
    w13, w2 = random_packed(rng, "bf16", E, 2 * I, H), random_packed(rng, "bf16", E, H, I)
    t13, t2 = torch.from_numpy(w13.unpack()), torch.from_numpy(w2.unpack())
    weights = {"fp32": (t13, t2), "bf16": (t13.to(torch.bfloat16), t2.to(torch.bfloat16))}
    F = torch.nn.functional

    def loop(x, ids, tw, a13, a2):
        out = torch.zeros(x.shape[0], H, dtype=x.dtype)
        for e in torch.unique(ids).tolist():
            rows, cols = torch.nonzero(ids == e, as_tuple=True)
            y = F.linear(x[rows], a13[e])
            out.index_add_(0, rows, F.linear(F.silu(y[:, :I]) * y[:, I:], a2[e]) * tw[rows, cols, None])
        return out

    print(f"\ntorch {torch.__version__} peer (qwen3-30b-a3b shape, vLLM-style loop over experts, {threads} threads): "
          "ms per call (GFLOPS)" + (f"; torch held to ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']}, "
                                     f"ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']}" if held else ""))
    print(f"{'M':>5} {'moe_cpu bf16':>20} {'torch fp32 weights':>20} {'torch bf16 weights':>20} {'x fp32':>7} {'x bf16':>7}")
    rows = []
    with torch.inference_mode():
        for M in ms:
            x = rng.standard_normal((M, H), dtype=np.float32)
            tw = np.full((M, k), 1.0 / k, np.float32)
            ids = np.ascontiguousarray(np.argsort(rng.random((M, E)), axis=1)[:, :k], dtype=np.int32)
            ops = 2.0 * M * k * 3 * H * I
            t_ours = timed(lambda: api.fused_experts(x, w13, w2, tw, ids), 0.5)
            r = dict(M=M, kernel=w13.kernel, moe_cpu_ms=t_ours * 1e3, moe_cpu_gflops=ops / t_ours / 1e9,
                     torch_version=torch.__version__, torch_held_to=held)
            for name, (a13, a2) in weights.items():
                dt = a13.dtype
                xt, twt, idt = torch.from_numpy(x).to(dt), torch.from_numpy(tw).to(dt), torch.from_numpy(ids).long()
                t = timed(lambda: loop(xt, idt, twt, a13, a2), 0.5, 10)
                r[f"torch_{name}_ms"], r[f"torch_{name}_gflops"] = t * 1e3, ops / t / 1e9
            rows.append(r)
            cell = lambda n: f"{r[n + '_ms']:>9.2f} ({r[n + '_gflops']:>6.1f})"
            print(f"{M:>5} {cell('moe_cpu'):>20} {cell('torch_fp32'):>20} {cell('torch_bf16'):>20} "
                  f"{r['torch_fp32_ms'] / r['moe_cpu_ms']:>7.1f} {r['torch_bf16_ms'] / r['moe_cpu_ms']:>7.1f}")
    return rows
