#!/usr/bin/env python3
"""GGUF's forms on the AMX tiles against their AVX-512 twin: twin ms / tiles ms, each expert given r rows.

int8 g32 (Q8_0), int4 g32 (Q4_0) with act_block 32, and the per-channel / g128 forms, E = 16, k = 8, both kernels
interleaved. Needs a host whose AMX tiles are active (on any other the two settings run the same kernel).

    python bench/studies/amx_g32_forms.py [--rows 16,32,64,128] [--experts 16]
    python bench/studies/amx_g32_forms.py --rows 16 --forms int8_g32 --experts 8 --seconds 0.05   # a quick check
"""
import argparse

import numpy as np

import moe_cpu
from moe_cpu.bench.amx import NEVER
from moe_cpu.bench.timing import timed

# name -> (scheme, group size, act_block)
FORMS = {"int8_g32": ("int8_w8a8", 32, 32), "int8_pc": ("int8_w8a8", -1, None),
         "int4_g32": ("int4_w4a8", 32, 32), "int4_g128": ("int4_w4a8", 128, None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="16,32,64,128", help="rows per expert (default 16,32,64,128)")
    ap.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated (default {','.join(FORMS)})")
    ap.add_argument("--experts", type=int, default=16, help="experts (default 16; at least top-k 8)")
    ap.add_argument("--seconds", type=float, default=0.3, help="timing per point and kernel (default 0.3)")
    a = ap.parse_args(argv)
    E, k, H, I = a.experts, 8, 2048, 768
    forms = a.forms.split(",")
    bad = [f for f in forms if f not in FORMS]
    if bad:
        ap.error(f"--forms: unknown {bad[0]!r}; choose from {', '.join(FORMS)}")
    try:
        rows = [int(r) for r in a.rows.split(",")]
    except ValueError:
        ap.error(f"--rows {a.rows!r}: expected comma-separated integers")
    if any(r < 1 for r in rows):
        ap.error(f"--rows {a.rows}: rows per expert must be >= 1")
    if E < k:
        ap.error(f"--experts {E} must be >= the top-k of {k}")
    if a.seconds <= 0:
        ap.error("--seconds must be > 0")
    f = moe_cpu.cpu_features()
    if "amx" not in f["active"]:
        ap.error(f"needs AMX tiles: not active here ({f['amx']}; level {f['isa']})")
    rng = np.random.default_rng(0)
    for form in forms:
        scheme, g, ab = FORMS[form]
        w13 = moe_cpu.quantize_experts(rng.standard_normal((E, 2 * I, H), dtype=np.float32), scheme, group_size=g,
                                       act_block=ab)
        w2 = moe_cpu.quantize_experts(rng.standard_normal((E, H, I), dtype=np.float32), scheme, group_size=g,
                                      act_block=ab)
        for r in rows:
            M = max(1, r * E // k)
            x = rng.standard_normal((M, H), dtype=np.float32)
            ids = ((np.arange(M)[:, None] * k + np.arange(k)[None, :]) % E).astype(np.int32)
            tw = np.full((M, k), 1.0 / k, np.float32)
            t = {}
            for _ in range(2):
                for name, th in (("twin", NEVER), ("tiles", 1)):
                    moe_cpu.set_amx_min_rows(th)
                    t[name] = min(t.get(name, np.inf),
                                  timed(lambda: moe_cpu.fused_experts(x, w13, w2, tw, ids), a.seconds))
            moe_cpu.set_amx_min_rows(None)
            print(f"{scheme} g{g} act_block {ab}: r {r:4d}  twin {t['twin'] * 1e3:8.3f}  tiles {t['tiles'] * 1e3:8.3f}"
                  f"  x {t['twin'] / t['tiles']:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
