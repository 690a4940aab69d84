#!/usr/bin/env python3
"""Time of quiet calls on moe_cpu's own compute team against OpenMP's team, as a paired A/B in one run.

Each round runs one process per team in turn (``MOE_CPU_TEAM=moe_cpu`` then ``MOE_CPU_TEAM=omp``, the order
alternating between rounds); each process times the Qwen3-30B-A3B block (int4_w4a8, groups of 128, random codes,
128 experts or --experts, fresh routing per call, decode walking a permutation so weights come from memory) at
every M and prints the median ms. The summary is, per M, the median over rounds of moe_cpu / omp and the range
of those ratios.

Usage
    python bench/team_ab.py                       # M = 1, 128, 1024; 6 rounds; 2 threads
    python bench/team_ab.py --rounds 10 --m 1 --extra-env GOMP_SPINCOUNT=300000
    python bench/team_ab.py --rounds 1 --m 1 --experts 8 --calls 5                   # a quick check
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
H, I, K = 2048, 768, 8
Ms, threads, E, n_calls = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
moe_cpu.set_num_threads(threads)
rng = np.random.default_rng(0)
w13, w2 = random_block(rng, "int4_w4a8", H, I, E)
out = {}
for M in Ms:
    x = rng.standard_normal((M, H)).astype(np.float32)
    pool = routing_pool(rng, E, K, M)
    calls = n_calls or (400 if M == 1 else 30 if M <= 256 else 6)
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="1,128,1024", help="token counts (default 1,128,1024)")
    ap.add_argument("--rounds", type=int, default=6, help="paired rounds (default 6)")
    ap.add_argument("--threads", type=int, default=2, help="threads of either team (default 2)")
    ap.add_argument("--experts", type=int, default=128, help="experts in the block (default 128; at least top-k 8)")
    ap.add_argument("--calls", type=int, default=0, help="timed calls per M (default 400 at M = 1, 30 to 256, 6 above)")
    ap.add_argument("--extra-env", action="append", default=[], help="VAR=VALUE for both processes")
    args = ap.parse_args(argv)
    try:
        Ms = [int(v) for v in args.m.split(",")]
    except ValueError:
        ap.error(f"--m {args.m!r}: expected comma-separated token counts")
    if args.rounds < 1 or args.threads < 1 or any(m < 1 for m in Ms):
        ap.error("--rounds, --threads and --m must be >= 1")
    if args.experts < 8 or args.calls < 0:
        ap.error("--experts must be >= the top-k of 8, --calls >= 0")
    base = dict(os.environ)
    for kv in args.extra_env:
        k, eq, v = kv.partition("=")
        if not k or not eq:
            ap.error(f"--extra-env takes VAR=VALUE: got {kv!r}")
        base[k] = v
    ratios = {M: [] for M in Ms}
    print(f"# host: {os.cpu_count()} CPUs; threads {args.threads}; extra env {args.extra_env or '-'}; "
          f"int4_w4a8 g128 Qwen3-30B-A3B block; median ms per process")
    for r in range(args.rounds):
        res = {}
        for team in (("moe_cpu", "omp") if r % 2 == 0 else ("omp", "moe_cpu")):
            env = dict(base, MOE_CPU_TEAM=team)
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(Ms), str(args.threads), str(args.experts),
                                str(args.calls)], env=env, capture_output=True, text=True)
            if p.returncode != 0:
                why = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
                raise SystemExit(f"team_ab.py: the MOE_CPU_TEAM={team} process failed: {why}")
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
