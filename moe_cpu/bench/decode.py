"""Decode (M = 1) hot and cold, beside the read bandwidth, in the same rounds (``moe-cpu bench --decode``).

Each round measures, for one weight form: the machine's read bandwidth (the probe of ``moe-cpu bench``), then
decode with cold weights (each call routes to experts not used in the previous E/k calls: every expert byte comes
from DRAM), then decode with hot weights (the same k experts every call: their bytes stay in the caches). GB/s are
the routed experts' packed bytes per second of the ``fused_experts`` call. Medians over the rounds are printed:

    cold / bw        the share of the read bandwidth that cold decode streams
    cold / min       cold against min(hot, bw): 1.0 when decode streams as fast as either its arithmetic (hot) or
                     the memory (bw) allows; below that, the stream of bytes from DRAM is what holds it
    hot / bw         above 1: the kernel has headroom over the memory; below 1: decode is compute-bound
"""
from __future__ import annotations

import statistics

import numpy as np

from .. import _core, api as moe_cpu
from .random_forms import random_codes
from .shapes import SHAPES
from .timing import Routing, timed, weight_bytes

# Every form decode is judged on: the schemes (int4 g128, int4 per channel, int8 per channel, fp8, bf16, A16) and
# the GGUF forms as the loader packs them (activation blocks of 32).
DECODE_ROWS = ["int4_w4a8", "int4_pc", "int8_w8a8", "fp8_w8a16", "bf16", "int4_w4a16", "int8_w8a16",
               "q4_0", "q8_0", "q4_k", "iq4_xs", "q5_k", "q6_k", "mxfp4"]


def decode_hot_cold(rng, shapes, forms, rounds, experts=0, out=print):
    """Rows of medians (GB/s and ratios) per (shape, form); prints one line per row."""
    threads = moe_cpu.get_num_threads()
    buf = _core.ReadBuffer(1 << 30)
    out(f"decode hot / cold: {threads} threads, {rounds} rounds of (read probe, cold decode, hot decode); medians")
    out(f"{'shape':14} {'form':11} {'kernel':18} {'MB/call':>8} {'bw':>6} {'cold':>6} {'hot':>6} "
        f"{'cold/bw':>8} {'cold/min':>9} {'hot/bw':>7}")
    rows = []
    for shape in shapes:
        H, I, _, k, E, _ = SHAPES[shape]
        E = experts or E
        for form in forms:
            w13, w2 = random_codes(rng, form, E, 2 * I, H, True)(), random_codes(rng, form, E, H, I, True)()
            x = rng.standard_normal((1, H), dtype=np.float32)
            tw = np.full((1, k), 1.0 / k, np.float32)
            route = Routing(rng, E, k)
            calls = [route.next(1) for _ in range(64)]
            state = {"i": 0}

            def cold():
                ids = calls[state["i"] % len(calls)]
                state["i"] += 1
                moe_cpu.fused_experts(x, w13, w2, tw, ids)

            def hot():
                moe_cpu.fused_experts(x, w13, w2, tw, calls[0])

            gb = weight_bytes(w13, w2, calls[0])
            bw, cg, hg = [], [], []
            for _ in range(rounds):
                bw.append(buf.read_gbs(threads, 1))
                cg.append(gb / timed(cold, 0.2) / 1e9)
                hg.append(gb / timed(hot, 0.2) / 1e9)
            r = dict(shape=shape, form=form, kernel=w13.kernel, threads=threads, mb_per_call=gb / 1e6,
                     bw_gbs=statistics.median(bw), cold_gbs=statistics.median(cg), hot_gbs=statistics.median(hg),
                     rounds=dict(bw=bw, cold=cg, hot=hg))
            # ratios per round, then their median: the host's phases cancel within a round
            r["cold_bw"] = statistics.median(c / b for c, b in zip(cg, bw))
            r["cold_min"] = statistics.median(c / min(h, b) for c, h, b in zip(cg, hg, bw))
            r["hot_bw"] = statistics.median(h / b for h, b in zip(hg, bw))
            rows.append(r)
            out(f"{shape:14} {form:11} {w13.kernel:18} {r['mb_per_call']:>8.2f} {r['bw_gbs']:>6.1f} "
                f"{r['cold_gbs']:>6.1f} {r['hot_gbs']:>6.1f} {100 * r['cold_bw']:>7.0f}% {r['cold_min']:>9.2f} "
                f"{r['hot_bw']:>7.2f}")
            del w13, w2
    return rows
