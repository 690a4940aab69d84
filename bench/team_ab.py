#!/usr/bin/env python3
"""Quiet calls on moe_cpu's own compute team against OpenMP's team, as a paired A/B in one run.

Each round runs one process per team in turn (``MOE_CPU_TEAM=moe_cpu`` then ``MOE_CPU_TEAM=omp``, the order
alternating between rounds); each process times the Qwen3-30B-A3B block (int4_w4a8, groups of 128, random codes,
fresh routing per call, decode walking a permutation so weights come from memory) at every M and prints the
median ms. The summary is, per M, the median over rounds of moe_cpu / omp and the range of those ratios.

Usage
    python bench/team_ab.py                       # M = 1, 128, 1024; 6 rounds; 2 threads
    python bench/team_ab.py --rounds 10 --m 1 --extra-env GOMP_SPINCOUNT=300000
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import moe_cpu
from moe_cpu.bench.random_forms import random_block
from moe_cpu.bench.timing import routing_pool
H, I, E, K = 2048, 768, 128, 8
Ms, threads = json.loads(sys.argv[1]), int(sys.argv[2])
moe_cpu.set_num_threads(threads)
rng = np.random.default_rng(0)
w13, w2 = random_block(rng, "int4_w4a8", H, I, E)
out = {}
for M in Ms:
    x = rng.standard_normal((M, H)).astype(np.float32)
    pool = routing_pool(rng, E, K, M)
    calls = 400 if M == 1 else 30 if M <= 256 else 6
    for i in range(3):
        moe_cpu.fused_experts(x, w13, w2, pool[i][1], pool[i][0])
    ts = []
    for i in range(calls):
        ids, tw = pool[i % 16]
        t0 = time.perf_counter()
        moe_cpu.fused_experts(x, w13, w2, tw, ids)
        ts.append(time.perf_counter() - t0)
    out[M] = statistics.median(ts) * 1e3
print(json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", default="1,128,1024")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extra-env", action="append", default=[], help="VAR=VALUE for both processes")
    args = ap.parse_args(argv)
    Ms = [int(v) for v in args.m.split(",")]
    if args.rounds < 1 or args.threads < 1 or any(m < 1 for m in Ms):
        ap.error("--rounds, --threads and --m must be >= 1")
    base = dict(os.environ)
    for kv in args.extra_env:
        k, _, v = kv.partition("=")
        base[k] = v
    ratios = {M: [] for M in Ms}
    print(f"# host: {os.cpu_count()} CPUs; threads {args.threads}; extra env {args.extra_env or '-'}; "
          f"int4_w4a8 g128 Qwen3-30B-A3B block; median ms per process")
    for r in range(args.rounds):
        res = {}
        for team in (("moe_cpu", "omp") if r % 2 == 0 else ("omp", "moe_cpu")):
            env = dict(base, MOE_CPU_TEAM=team)
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(Ms), str(args.threads)], env=env,
                               capture_output=True, text=True, check=True)
            res[team] = {int(k): v for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()}
        for M in Ms:
            ratios[M].append(res["moe_cpu"][M] / res["omp"][M])
        print(f"  round {r}: " + "  ".join(f"M={M} moe_cpu {res['moe_cpu'][M]:.3f} omp {res['omp'][M]:.3f}" for M in Ms),
              flush=True)
    for M in Ms:
        q = ratios[M]
        print(f"M={M:5d}: moe_cpu / omp median {statistics.median(q):.3f} (rounds {min(q):.3f} .. {max(q):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
