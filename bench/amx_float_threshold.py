#!/usr/bin/env python3
"""bf16 / fp8 on the Qwen3-30B-A3B block (E 128, top-8): the old default (all forms from 16 rows) against the new
(bf16 / fp8 from 8), interleaved in one process; ms per call, min of rounds."""
import time, numpy as np, moe_cpu
from moe_cpu.bench.random_forms import random_packed
rng = np.random.default_rng(0)
E, k, H, I = 128, 8, 2048, 768
def timed(f, n):
    f(); t = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t) / n
for scheme in ("bf16", "fp8_w8a16"):
    w13, w2 = random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
    for M in (64, 128, 192, 256):
        x = rng.standard_normal((M, H), dtype=np.float32)
        logits = rng.standard_normal((M, E), dtype=np.float32)
        ids = np.argsort(-logits, axis=1)[:, :k].astype(np.int32)
        tw = np.full((M, k), 1.0 / k, np.float32)
        t = {"old": [], "new": []}
        for _ in range(5):
            for name, th in (("old", 16), ("new", None)):
                moe_cpu.set_amx_min_rows(th)
                t[name].append(timed(lambda: moe_cpu.fused_experts(x, w13, w2, tw, ids), 3))
        moe_cpu.set_amx_min_rows(None)
        o, n = min(t["old"]) * 1e3, min(t["new"]) * 1e3
        print(f"{scheme:<10} M={M:<4} rows/expert {M * k / E:5.1f}  old {o:8.3f} ms  new {n:8.3f} ms  old/new {o / n:5.2f}")
