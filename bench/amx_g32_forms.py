#!/usr/bin/env python3
"""GGUF's forms on the tiles or the AVX-512 twin: int8 g32 (Q8_0), int4 g32 (Q4_0) with act_block 32, and the
per-channel / g128 forms, E = 16, k = 8, each expert r rows; twin ms / tiles ms, interleaved."""
import numpy as np, moe_cpu
from moe_cpu.bench.amx import NEVER
from moe_cpu.bench.timing import timed
rng = np.random.default_rng(0)
E, k, H, I = 16, 8, 2048, 768
forms = [("int8_w8a8", 32, 32), ("int8_w8a8", -1, None), ("int4_w4a8", 32, 32), ("int4_w4a8", 128, None)]
for scheme, g, ab in forms:
    w13 = moe_cpu.quantize_experts(rng.standard_normal((E, 2 * I, H), dtype=np.float32), scheme, group_size=g, act_block=ab)
    w2 = moe_cpu.quantize_experts(rng.standard_normal((E, H, I), dtype=np.float32), scheme, group_size=g, act_block=ab)
    for r in (16, 32, 64, 128):
        M = r * E // k
        x = rng.standard_normal((M, H), dtype=np.float32)
        ids = ((np.arange(M)[:, None] * k + np.arange(k)[None, :]) % E).astype(np.int32)
        tw = np.full((M, k), 1.0 / k, np.float32)
        t = {}
        for _ in range(2):
            for name, th in (("twin", NEVER), ("tiles", 1)):
                moe_cpu.set_amx_min_rows(th)
                t[name] = min(t.get(name, np.inf), timed(lambda: moe_cpu.fused_experts(x, w13, w2, tw, ids), 0.3))
        moe_cpu.set_amx_min_rows(None)
        print(f"{scheme} g{g} act_block {ab}: r {r:4d}  twin {t['twin']*1e3:8.3f}  tiles {t['tiles']*1e3:8.3f}  x {t['twin']/t['tiles']:5.2f}", flush=True)
