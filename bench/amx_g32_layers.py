#!/usr/bin/env python3
"""GGUF layers on an AMX host: the default against a set threshold, interleaved rounds, 2 threads; median ms per
call of MoELayer.from_pretrained on bench/ik_peer.py's cached files (run its --prepare-only first).
    python bench/amx_g32_layers.py [THRESHOLD (default 1: every expert on the tiles)] [TYPES (default all five)]"""
import statistics, sys, time
import numpy as np, moe_cpu
THR = int(sys.argv[1]) if len(sys.argv) > 1 else 1
TYPES = sys.argv[2].split(",") if len(sys.argv) > 2 else ("Q4_0", "Q8_0", "Q4_K", "IQ4_XS", "Q5_K")
moe_cpu.set_num_threads(2)
rng = np.random.default_rng(0)
for t in TYPES:
    layer = moe_cpu.MoELayer.from_pretrained(f"/tmp/ik_peer_models/q_H2048_E128_I768_k8_s0_f16_{t}.gguf", layer_idx=0)
    for M in (128, 512):
        xs = [rng.standard_normal((M, 2048), dtype=np.float32) for _ in range(3)]
        res = {"default": [], "set": []}
        for rnd in range(5):
            for name, th in (("default", None), ("set", THR)):
                moe_cpu.set_amx_min_rows(th)
                layer(xs[0])
                t0 = time.perf_counter()
                for x in xs:
                    layer(x)
                res[name].append((time.perf_counter() - t0) / len(xs))
        moe_cpu.set_amx_min_rows(None)
        d, s = statistics.median(res["default"]) * 1e3, statistics.median(res["set"]) * 1e3
        print(f"{t:7s} M {M:4d}: default {d:8.2f} ms  threshold {THR} {s:8.2f} ms  set/default {s / d:5.2f}",
              flush=True)
