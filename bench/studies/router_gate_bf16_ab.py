#!/usr/bin/env python3
"""MoELayer's call with a gate of bf16 values (its router reads them as bf16) against the same gate with one value
nudged off bf16 (read as float32), paired in one process.

What it runs
    A random block of a form (moe_cpu.bench.random_forms: the Qwen3-30B-A3B shape, H 2048, I 768, ``--experts``
    experts), and ``--layers`` MoELayers over it, each with its own random gate of bf16 values (top-8, renormalized): A reads them as bf16, B the same
    gates with one value moved off bf16 as float32. Each round times the median of ``--calls`` calls of A's layers in
    turn, then B's (the order flips every round), on 16 inputs in turn. With one layer its router stays in L3 between
    calls; with 24 (a model's routers) it comes from DRAM, as in a model.

What it prints
    Per round both medians and their ratio; then the median of the ratios (A / B) and its quartiles.

Usage
    python3 bench/studies/router_gate_bf16_ab.py --form q4_k --layers 24 --rounds 14
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--form", default="q4_k", help="a scheme or form of moe_cpu.bench.random_forms (q4_k, q8_0, int4_w4a8, ...)")
    ap.add_argument("--experts", type=int, default=128, help="experts (at least the top-k of 8)")
    ap.add_argument("--layers", type=int, default=24, help="layers (routers) called in turn")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=240)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    if a.layers < 1 or a.rounds < 1 or a.calls < 1:
        ap.error("--layers, --rounds and --calls must be >= 1")
    if a.experts < 8:
        ap.error(f"--experts {a.experts} must be >= the top-k of 8")
    import moe_cpu as mc
    from moe_cpu.bench.random_forms import FORMS, random_block

    forms = sorted(FORMS) + ["int4_w4a8", "int8_w8a8", "fp8_w8a16", "bf16"]
    if a.form not in forms:
        ap.error(f"--form {a.form!r}: one of {', '.join(forms)}")
    rng = np.random.default_rng(3)
    w13, w2 = random_block(rng, a.form, 2048, 768, a.experts)
    mc.set_num_threads(a.threads)
    E, H = a.experts, 2048
    gates = [(rng.standard_normal((E, H), dtype=np.float32).view(np.uint32) & np.uint32(0xffff0000)).view(np.float32)
             for _ in range(a.layers)]

    def layers(exact: bool):
        out = []
        for g in gates:
            g = g.copy()
            if not exact:
                g[0, 0] = np.nextafter(g[0, 0], np.float32(1))
            out.append(mc.MoELayer(g, w13, w2, top_k=8, renormalize=True))
        return out

    sets = {"bf16": layers(True), "float32": layers(False)}
    assert all(l._plan.gate_bf16 for l in sets["bf16"]) and not any(l._plan.gate_bf16 for l in sets["float32"])
    xs = [rng.standard_normal((1, H), dtype=np.float32) for _ in range(16)]
    ratios = []
    for r in range(a.rounds):
        t = {}
        for name in (("bf16", "float32") if r % 2 == 0 else ("float32", "bf16")):
            lays = sets[name]
            for i in range(2 * a.layers):
                lays[i % a.layers](xs[i % 16])
            ts = []
            for i in range(a.calls):
                t0 = time.perf_counter()
                lays[i % a.layers](xs[i % 16])
                ts.append(time.perf_counter() - t0)
            t[name] = float(np.median(ts))
        ratios.append(t["bf16"] / t["float32"])
        print(f"round {r}: bf16 gates {t['bf16'] * 1e3:.3f} ms, float32 gates {t['float32'] * 1e3:.3f} ms, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    q1, q3 = np.percentile(ratios, [25, 75])
    print(f"{a.form}, {a.layers} layers' routers in turn: bf16 gates / float32 gates, median of {a.rounds} rounds "
          f"{np.median(ratios):.3f} (quartiles {q1:.3f}-{q3:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
