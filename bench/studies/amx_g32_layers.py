#!/usr/bin/env python3
"""GGUF layers on an AMX host: ms per call with a set AMX row threshold against the default, interleaved rounds.

MoELayer.from_pretrained on bench/ik_peer.py's cached files of the Qwen3-30B-A3B block (run ``bench/ik_peer.py
--prepare-only`` first), 2 threads, the median of the rounds. Needs a host whose AMX tiles are active.

    python bench/studies/amx_g32_layers.py [THRESHOLD (default 1: every expert on the tiles)] [TYPES (default all five)]
    python bench/studies/amx_g32_layers.py 1 Q4_0 --m 128 --rounds 1                 # a quick check
"""
import argparse
import os
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu._argtypes import token_counts

TYPES = "Q4_0,Q8_0,Q4_K,IQ4_XS,Q5_K"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("threshold", nargs="?", type=int, default=1,
                    help="rows per expert from which the tiles run (default 1: every expert on the tiles)")
    ap.add_argument("types", nargs="?", default=TYPES, help=f"GGUF types, comma-separated (default {TYPES})")
    ap.add_argument("--m", type=token_counts, default="128,512", help="token counts (default 128,512)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--work-dir", default="/tmp/ik_peer_models", help="bench/ik_peer.py's GGUF cache")
    a = ap.parse_args(argv)
    if a.threshold < 1:
        ap.error(f"THRESHOLD {a.threshold} must be >= 1")
    Ms = a.m
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    f = moe_cpu.cpu_features()
    if "amx" not in f["active"]:
        ap.error(f"needs AMX tiles: not active here ({f['amx']}; level {f['isa']})")
    files = {t: os.path.join(a.work_dir, f"q_H2048_E128_I768_k8_s0_f16_{t}.gguf") for t in a.types.split(",")}
    missing = [t for t, p in files.items() if not os.path.isfile(p)]
    if missing:
        ap.error(f"no {files[missing[0]]}: run bench/ik_peer.py --prepare-only --types {','.join(missing)} first")
    moe_cpu.set_num_threads(2)
    rng = np.random.default_rng(0)
    for t, path in files.items():
        layer = moe_cpu.MoELayer.from_pretrained(path, layer_idx=0)
        for M in Ms:
            xs = [rng.standard_normal((M, 2048), dtype=np.float32) for _ in range(3)]
            res = {"default": [], "set": []}
            for _ in range(a.rounds):
                for name, th in (("default", None), ("set", a.threshold)):
                    moe_cpu.set_amx_min_rows(th)
                    layer(xs[0])
                    t0 = time.perf_counter()
                    for x in xs:
                        layer(x)
                    res[name].append((time.perf_counter() - t0) / len(xs))
            moe_cpu.set_amx_min_rows(None)
            d, s = statistics.median(res["default"]) * 1e3, statistics.median(res["set"]) * 1e3
            print(f"{t:7s} M {M:4d}: default {d:8.2f} ms  threshold {a.threshold} {s:8.2f} ms  "
                  f"set/default {s / d:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
