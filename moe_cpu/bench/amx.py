"""The AMX crossover: rows per expert at which the tile kernels beat their AVX-512 twins, measured (not
guessed) with every expert given the same number of rows, tiles for all (set_amx_min_rows(1)) against
tiles for none, interleaved in one run."""
from __future__ import annotations

import numpy as np

from .. import api
from .random_forms import random_packed
from .shapes import SHAPES
from .timing import timed

NEVER = 1 << 40   # a threshold no expert reaches: the AVX-512 twins only


def amx_crossover(rng, schemes=("int8_w8a8", "int4_w4a8", "bf16", "fp8_w8a16"), rows=(1, 2, 4, 8, 16, 32, 64, 128),
                  shape="qwen3-30b-a3b", experts=16, seconds=0.3):
    """Per scheme and rows per expert r: ms per call with the twins and with the tiles, and their ratio.
    Returns the rows (and prints the crossover: the smallest r from which the tiles win at every larger r)."""
    f = api.cpu_features()
    if "amx" not in f["active"]:
        print(f"\nAMX crossover: not measured here: AMX is not active ({f['amx']}; level {f['isa']})")
        return []
    H, I, _, k, _, _ = SHAPES[shape]
    E = experts
    before = f["amx_min_rows"] if f["amx_min_rows_set"] else None  # None: back to the defaults
    out = []
    print(f"\nAMX crossover ({shape} H={H} I={I}, E={E}, k={k}): ms per call, each expert given r rows")
    print(f"{'scheme':<10} {'r':>5} {'M':>6} {'avx512':>9} {'amx':>9} {'x':>6}")
    try:
        for scheme in schemes:
            w13, w2 = random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
            for r in rows:
                M = max(1, r * E // k)
                x = rng.standard_normal((M, H), dtype=np.float32)
                ids = ((np.arange(M)[:, None] * k + np.arange(k)[None, :]) % E).astype(np.int32)  # r rows each
                tw = np.full((M, k), 1.0 / k, np.float32)
                t = {}
                for _ in range(2):  # interleaved: the host's swings hit both
                    for name, th in (("avx512", NEVER), ("amx", 1)):
                        api.set_amx_min_rows(th)
                        t[name] = min(t.get(name, np.inf), timed(lambda: api.fused_experts(x, w13, w2, tw, ids), seconds))
                out.append(dict(scheme=scheme, rows=r, M=M, avx512_ms=t["avx512"] * 1e3, amx_ms=t["amx"] * 1e3,
                                speedup=t["avx512"] / t["amx"]))
                print(f"{scheme:<10} {r:>5} {M:>6} {t['avx512'] * 1e3:>9.3f} {t['amx'] * 1e3:>9.3f} {t['avx512'] / t['amx']:>6.2f}")
            wins = [o["rows"] for o in out if o["scheme"] == scheme]
            won = [o["speedup"] > 1 for o in out if o["scheme"] == scheme]
            cross = next((wins[i] for i in range(len(wins)) if all(won[i:])), None)
            print(f"{scheme:<10} crossover: {cross if cross is not None else 'none in ' + str(tuple(rows))} rows per expert")
            del w13, w2
    finally:
        api.set_amx_min_rows(before)
    return out
