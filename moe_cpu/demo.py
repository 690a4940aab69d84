"""Demo: a Qwen3-30B-A3B-shaped MoE layer in every scheme (python -m moe_cpu.demo).

Builds random weights (H=2048, I=768, E=128, k=8), packs them in each of the four schemes, routes
64 tokens with ``select_experts`` and runs ``fused_experts``. For each scheme it prints the error
against the float64 unquantized layer, the time per call and the packed weight bytes.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import api
from ._argtypes import at_least


def float64_layer(x, w13, w2, topk_w, topk_ids):
    """Unquantized float64 result, one expert at a time (no full-size float64 copy)."""
    M, k = topk_ids.shape
    I = w2.shape[2]
    out = np.zeros((M, w2.shape[1]))
    for e in np.unique(topk_ids):
        rows, cols = np.nonzero(topk_ids == e)
        y = x[rows].astype(np.float64) @ w13[e].astype(np.float64).T
        g, u = y[:, :I], y[:, I:]
        h = g / (1.0 + np.exp(-g)) * u
        np.add.at(out, rows, (h @ w2[e].astype(np.float64).T) * topk_w[rows, cols][:, None])
    return out


def main(argv=None) -> int:
    _positive = at_least(1, int, "a positive integer")
    p = argparse.ArgumentParser(prog="moe-cpu demo", description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=_positive, default=2048, help="H, a multiple of 128 (int4's group)")
    p.add_argument("--inter", type=_positive, default=768, help="I, a multiple of 128 (int4's group)")
    p.add_argument("--experts", type=_positive, default=128)
    p.add_argument("--topk", type=_positive, default=8, help="at most --experts")
    p.add_argument("--tokens", type=_positive, default=64)
    p.add_argument("--repeats", type=_positive, default=3)
    a = p.parse_args(argv)
    if a.hidden % 128 or a.inter % 128:
        p.error(f"--hidden {a.hidden} and --inter {a.inter} must be multiples of 128 (the int4 group size)")
    if a.topk > a.experts:
        p.error(f"--topk {a.topk} is more than --experts {a.experts}")
    try:
        _run(a)
    except MemoryError as e:
        print(f"moe-cpu demo: error: not enough memory ({e})", file=sys.stderr)
        return 2
    return 0


def _run(a: argparse.Namespace) -> None:
    H, I, E, k, M = a.hidden, a.inter, a.experts, a.topk, a.tokens
    rng = np.random.default_rng(0)
    print(f"moe_cpu demo: Qwen3-30B-A3B-shaped layer H={H} I={I} E={E} k={k}, {M} tokens, "
          f"{api.get_num_threads()} threads, ISA level '{api.cpu_features()['isa']}'")
    w13 = (rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.02)
    w2 = (rng.standard_normal((E, H, I), dtype=np.float32) * 0.02)
    x = rng.standard_normal((M, H), dtype=np.float32)
    gate = rng.standard_normal((H, E), dtype=np.float32) * 0.05
    topk_w, topk_ids = api.select_experts(x @ gate, k, renormalize=True)
    ref = float64_layer(x, w13, w2, topk_w, topk_ids)
    print(f"routing: {len(np.unique(topk_ids))} of {E} experts touched; float32 weights "
          f"{(w13.nbytes + w2.nbytes) / 2**20:.0f} MiB")
    header = f"{'scheme':<10} {'kernel':<16} {'rel L2 err':>10} {'max abs err':>11} {'ms/call':>9} {'weight MiB':>10} {'pack s':>7}"
    print(header)
    print("-" * len(header))
    for scheme in api.SCHEMES:
        t0 = time.perf_counter()
        p13 = api.quantize_experts(w13, scheme)
        p2 = api.quantize_experts(w2, scheme, group_size=128 if scheme == "int4_w4a8" else None)
        t_pack = time.perf_counter() - t0
        out = api.fused_experts(x, p13, p2, topk_w, topk_ids)
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            api.fused_experts(x, p13, p2, topk_w, topk_ids)
            times.append(time.perf_counter() - t0)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        print(f"{scheme:<10} {p13.kernel:<16} {err:>10.4f} {np.abs(out - ref).max():>11.2e} "
              f"{1e3 * min(times):>9.1f} {(p13.nbytes + p2.nbytes) / 2**20:>10.1f} {t_pack:>7.1f}")
        del p13, p2


if __name__ == "__main__":
    raise SystemExit(main())
