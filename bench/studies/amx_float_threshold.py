#!/usr/bin/env python3
"""bf16 / fp8 on AMX tiles from 8 rows per expert (the new default) against from 16 (the old): ms per call.

The Qwen3-30B-A3B block (E 128, top-8), both thresholds interleaved in one process, the min of the rounds.
Needs a host whose AMX tiles are active (on any other the two thresholds run the same kernel).

    python bench/studies/amx_float_threshold.py [--m 64,128,192,256] [--rounds 5] [--experts 128]
    python bench/studies/amx_float_threshold.py --m 64 --rounds 1 --experts 8 --schemes bf16   # a quick check
"""
import argparse
import time

import numpy as np

import moe_cpu
from moe_cpu.bench.random_forms import random_packed
from moe_cpu._argtypes import token_counts

SCHEMES = ("bf16", "fp8_w8a16")


def timed(f, n):
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=token_counts, default="64,128,192,256", help="token counts (default 64,128,192,256)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--experts", type=int, default=128, help="experts in the block (default 128; at least top-k 8)")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated (default {','.join(SCHEMES)})")
    a = ap.parse_args(argv)
    E, k, H, I = a.experts, 8, 2048, 768
    Ms = a.m
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    if E < k:
        ap.error(f"--experts {E} must be >= the top-k of {k}")
    schemes = a.schemes.split(",")
    bad = [s for s in schemes if s not in SCHEMES]
    if bad:
        ap.error(f"--schemes: unknown {bad[0]!r}; choose from {', '.join(SCHEMES)}")
    f = moe_cpu.cpu_features()
    if "amx" not in f["active"]:
        ap.error(f"needs AMX tiles: not active here ({f['amx']}; level {f['isa']})")
    rng = np.random.default_rng(0)
    for scheme in schemes:
        w13, w2 = random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
        for M in Ms:
            x = rng.standard_normal((M, H), dtype=np.float32)
            logits = rng.standard_normal((M, E), dtype=np.float32)
            ids = np.argsort(-logits, axis=1)[:, :k].astype(np.int32)
            tw = np.full((M, k), 1.0 / k, np.float32)
            t = {"old": [], "new": []}
            for _ in range(a.rounds):
                for name, th in (("old", 16), ("new", None)):
                    moe_cpu.set_amx_min_rows(th)
                    t[name].append(timed(lambda: moe_cpu.fused_experts(x, w13, w2, tw, ids), 3))
            moe_cpu.set_amx_min_rows(None)
            o, n = min(t["old"]) * 1e3, min(t["new"]) * 1e3
            print(f"{scheme:<10} M={M:<4} rows/expert {M * k / E:5.1f}  old {o:8.3f} ms  new {n:8.3f} ms  "
                  f"old/new {o / n:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
