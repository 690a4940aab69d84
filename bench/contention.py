#!/usr/bin/env python3
"""Per-call latency of moe_cpu beside N busy neighbour processes, against its quiet latency (and ik_llama.cpp's).

What it runs
    The Qwen3-30B-A3B MoE block (H 2048, 128 experts or ``--experts``, FFN 768, top-8) in int4_w4a8 with groups of
    128 (random codes: values do not change the speed), ``moe_cpu.fused_experts`` on fresh routing each call (decode
    walks a permutation so that an expert comes back only every 16 calls, as bench_moe does), ``--threads`` threads.
    For each M in ``--m``: a quiet run, then one run per count in ``--neighbours``: that many processes that each
    spin a Python busy loop (started before the run, stopped after it), so the team shares the CPUs with them
    as with a GPU driver thread, a front end or other guests. Every call is timed on its own.

What it prints
    Per (M, neighbours): p10 / p50 / p90 ms, and p50 and p90 over the quiet p50. The fair share with n
    neighbours on c cores and t threads is the quiet time times (t + n) / c when t + n > c (2 threads and 1
    neighbour on 2 cores: 1.5x); a team whose threads spin while one of them is descheduled does far worse.
    ``--ik`` adds ik_llama.cpp (its PyPI wheel, bench/ik_peer.py's one-layer Q4_0 model, whole-model decode
    calls) under the same neighbours, where that wheel is installed.
    ``--spin-ref`` adds "spin-1t": one thread (no team, no memory traffic) doing a fixed amount of work that
    takes as long as moe_cpu's quiet p50 at that M. Its tail beside neighbours is what the scheduler does to any
    call of that length from this caller, whatever runs inside it.

Usage
    python bench/contention.py                                   # M = 1, 128; 0 (quiet), 1, 2 neighbours
    python bench/contention.py --m 1 --neighbours 2 --calls 400
    python bench/contention.py --m 1 --neighbours 0 --calls 3 --experts 8       # a quick check
    MOE_CPU_TEAM=omp python bench/contention.py                  # the same on OpenMP's team, to compare
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Dict, List

import numpy as np

import moe_cpu
from moe_cpu.bench.random_forms import random_block
from moe_cpu.bench.timing import routing_pool

H, I, E, K = 2048, 768, 128, 8
IK_DIR = "/tmp/ikpeer"   # bench/ik_peer.py's default --ik-dir


def _work(n: int) -> None:  # n empty loop iterations: CPU only, no memory traffic
    for _ in range(n):
        pass


def _spin(stop) -> None:  # a busy neighbour: pure CPU until told to stop
    while not stop.is_set():
        _work(10000)


class Neighbours:
    """n busy-loop processes while the block runs."""

    def __init__(self, n: int):
        if n < 0:
            raise ValueError(f"neighbours = {n} must be >= 0")
        self.n, self.procs = n, []

    def __enter__(self):
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=_spin, args=(self.stop,), daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        time.sleep(0.3 if self.n else 0.0)  # let them reach their loops
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        return False


def percentiles(ms: List[float]) -> Dict[str, float]:
    a = np.asarray(ms)
    return {"p10": float(np.percentile(a, 10)), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90))}


def time_calls(fn, calls: int, warmup: int = 20) -> List[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def moe_cpu_case(M: int, w13, w2, rng, experts: int):
    x = rng.standard_normal((M, H)).astype(np.float32)
    pool = routing_pool(rng, experts, K, M)
    state = {"i": 0}

    def call():
        ids, tw = pool[state["i"] % len(pool)]
        state["i"] += 1
        moe_cpu.fused_experts(x, w13, w2, tw, ids)
    return call


def spin_case(target_ms: float):
    """One thread of fixed work that takes target_ms when it has a CPU to itself (calibrated here, quietly)."""
    n = 20000
    while True:
        t0 = time.perf_counter()
        _work(n)
        dt = (time.perf_counter() - t0) * 1e3
        if dt > 5.0:
            break
        n *= 2
    iters = max(1, int(n * target_ms / dt))
    return lambda: _work(iters)


def ik_case(M: int, threads: int):
    """ik_llama.cpp's whole-model decode of M tokens on bench/ik_peer.py's one-layer Q4_0 model."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ik_peer  # noqa: E402  (bench-only peer; never imported by the package)
    ik_dir = IK_DIR
    sys.path.insert(0, ik_dir)
    ik = ik_peer.Ik(ik_dir, threads, verbose=False)
    sh = ik_peer.QWEN3
    work = "/tmp/ik_peer_models"
    os.makedirs(work, exist_ok=True)
    base = os.path.join(work, f"base_{sh.tag(I)}_s0_f16.gguf")
    q = os.path.join(work, f"q_{sh.tag(I)}_s0_f16_Q4_0.gguf")
    if not os.path.exists(q):
        if not os.path.exists(base):
            ik_peer.write_base(base, sh, I, 0, "f16")
        ik_peer.quantize(ik.quantize_bin(), base, q, "Q4_0", threads, [])
    cfg = ik_peer.IkConfig.parse("rtr=1,fmoe=1")
    model = ik.load(q, cfg)
    ctx = ik.context(model, cfg, max(M, 1), callback=False)
    ik.make_batch(max(M, 1), 259, 0)
    return lambda: ik.decode(ctx, M, rotate=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="1,128", help="token counts (default 1,128)")
    ap.add_argument("--neighbours", default="1,2", help="busy-loop process counts to run beside (default 1,2)")
    ap.add_argument("--threads", type=int, default=2, help="moe_cpu threads (default 2)")
    ap.add_argument("--calls", type=int, default=0, help="timed calls per case (default 300 at M = 1, 40 above)")
    ap.add_argument("--ik", action="store_true", help="also time ik_llama.cpp's wheel under the same neighbours")
    ap.add_argument("--spin-ref", action="store_true",
                    help="also time one thread of fixed work as long as moe_cpu's quiet p50 (the scheduler's bound)")
    ap.add_argument("--experts", type=int, default=E, help=f"experts in the block (default {E}; at least top-k {K})")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        Ms = [int(v) for v in args.m.split(",")]
        counts = [int(v) for v in args.neighbours.split(",")]
    except ValueError:
        ap.error("--m and --neighbours take comma-separated integers")
    if any(n < 0 for n in counts):
        ap.error(f"--neighbours {args.neighbours}: a neighbour count must be >= 0")
    if any(m < 1 for m in Ms):
        ap.error(f"--m {args.m}: token counts must be >= 1")
    if args.calls < 0:
        ap.error("--calls must be >= 0")
    if args.experts < K:
        ap.error(f"--experts {args.experts} must be >= the top-k of {K}")
    if args.ik and not os.path.isdir(os.path.join(IK_DIR, "ik_llama_cpp")):
        ap.error(f"--ik: no ik_llama.cpp wheel in {IK_DIR} (pip install --no-deps --target {IK_DIR} "
                 f"ik-llama-cpp-python==0.1.5)")
    try:
        moe_cpu.set_num_threads(args.threads)
    except ValueError as e:   # named: outside [1, cores]
        ap.error(str(e))
    rng = np.random.default_rng(args.seed)
    w13, w2 = random_block(rng, "int4_w4a8", H, I, args.experts)
    print(f"# host: {os.cpu_count()} CPUs, load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}; "
          f"moe_cpu threads {args.threads}, kernel {w13.kernel}, team {moe_cpu.compute_team()}")
    print(f"# {'engine':8} {'M':>5} {'neigh':>5} | {'p10 ms':>8} {'p50 ms':>8} {'p90 ms':>8} | p50/quiet p90/quiet")
    quiet_moe: Dict[int, float] = {}
    engines = [("moe_cpu", lambda M: moe_cpu_case(M, w13, w2, rng, args.experts))]
    if args.spin_ref:
        engines.append(("spin-1t", lambda M: spin_case(quiet_moe[M])))
    if args.ik:
        engines.append(("ik", lambda M: ik_case(M, args.threads)))
    for name, make in engines:
        for M in Ms:
            fn = make(M)
            calls = args.calls or (300 if M == 1 else 40)
            quiet = None
            for n in [0] + [c for c in counts if c != 0]:
                with Neighbours(n):
                    p = percentiles(time_calls(fn, calls))
                quiet = quiet or p["p50"]
                if name == "moe_cpu" and n == 0:
                    quiet_moe[M] = quiet
                print(f"  {name:8} {M:5d} {n:5d} | {p['p10']:8.3f} {p['p50']:8.3f} {p['p90']:8.3f} | "
                      f"{p['p50'] / quiet:9.2f} {p['p90'] / quiet:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
