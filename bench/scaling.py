#!/usr/bin/env python3
"""Thread scaling of moe_cpu's Qwen3-30B-A3B MoE block: tokens/s against 1 thread, decode against read bandwidth.

At 1, 2, 4, 8, 16 threads and all cores: tokens/s, parallel efficiency and decode's share of the read bandwidth.

What it runs
    The block (H 2048, 128 experts or ``--experts``, FFN 768, top-8) in ``--scheme`` (default int4_w4a8, groups of
    128; random codes), ``moe_cpu.fused_experts`` on fresh routing each call: M = 1 (decode; a permutation walk, so
    an expert comes back only every 16 calls and its weights are read from memory) and M = 1024 (prefill), the
    median of ``--reps`` timed calls per (threads, M). Thread counts above the host's cores are skipped and reported
    as such (set_num_threads takes up to 1024 threads, but a team larger than the cores only measures the scheduler).

What it prints, per thread count t
    tokens/s at each M; parallel efficiency = tokens/s(t) / (t * tokens/s(1)); for decode, the bytes of the
    experts it reads per call (8 experts' w13 + w2) per second, as a share of the read bandwidth measured at t
    threads in the same run (``moe_cpu._core.ReadBuffer``: aligned loads over a 1 GiB first-touched buffer in huge
    pages, as the kernels read weights).
    Targets (issue 41): at least 80% efficiency from 1 to 16 threads at M = 1024, decode at 80% or more of the
    16-thread read bandwidth.

Usage
    python bench/scaling.py                       # 1, 2, 4, 8, 16 and all cores where the host has them
    python bench/scaling.py --threads 1,2 --reps 5 --out bench/out/scaling.log
    python bench/scaling.py --threads 1 --m 1 --reps 2 --experts 8 --bw-bytes 67108864   # a quick check
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu import _core
from moe_cpu.bench.random_forms import random_block
from moe_cpu.bench.timing import routing_pool

H, I, E, K = 2048, 768, 128, 8


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2,4,8,16,all",
                    help="thread counts; 'all' = every core (default 1,2,4,8,16,all)")
    ap.add_argument("--m", default="1,1024", help="token counts (default 1,1024)")
    ap.add_argument("--scheme", default="int4_w4a8", choices=moe_cpu.SCHEMES)
    ap.add_argument("--reps", type=int, default=0, help="timed calls per case (default 200 at M = 1, 5 above)")
    ap.add_argument("--bw-bytes", type=int, default=1 << 30, help="read-bandwidth buffer (default 1 GiB)")
    ap.add_argument("--experts", type=int, default=E, help=f"experts in the block (default {E}; at least top-k {K})")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    try:
        Ms = [int(v) for v in args.m.split(",")]
        ts = [cores if v == "all" else int(v) for v in args.threads.split(",")]
    except ValueError:
        ap.error("--threads takes integers or 'all'; --m integers")
    if any(t < 1 for t in ts) or any(m < 1 for m in Ms) or args.reps < 0:
        ap.error("thread counts and token counts must be >= 1, --reps >= 0")
    if args.experts < K:
        ap.error(f"--experts {args.experts} must be >= the top-k of {K}")
    if args.bw_bytes < 1 << 20:
        ap.error("--bw-bytes must be >= 1 MiB")
    experts = args.experts
    ts = sorted(set(ts))
    if ts[0] != 1:
        ts = [1] + ts  # efficiency is against one thread
    rng = np.random.default_rng(0)
    w13, w2 = random_block(rng, args.scheme, H, I, experts)
    per_expert = (w13.nbytes + w2.nbytes) / experts
    buf = _core.ReadBuffer(args.bw_bytes)
    lines = [f"# host: {cores} CPUs ({os.uname().machine}), load average "
             f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}; {args.scheme} {w13.kernel}; "
             f"team {moe_cpu.compute_team()}; Qwen3-30B-A3B block (H {H}, E {experts}, FFN {I}, top-{K}); "
             f"decode reads {K * per_expert / 2**20:.1f} MiB/call",
             f"# {'threads':>7} | " + " | ".join(f"M={M}: tok/s   eff" for M in Ms) + " | read GB/s  decode GB/s  share"]
    print("\n".join(lines), flush=True)
    base: dict = {}
    for t in ts:
        if t > cores:
            line = f"  {t:7d} | skipped: more threads than the host's {cores} cores"
            print(line, flush=True)
            lines.append(line)
            continue
        moe_cpu.set_num_threads(t)
        cells, dec_gbs = [], None
        for M in Ms:
            x = rng.standard_normal((M, H)).astype(np.float32)
            pool = routing_pool(rng, experts, K, M)
            reps = args.reps or (200 if M == 1 else 5)
            for i in range(3):
                moe_cpu.fused_experts(x, w13, w2, pool[i][1], pool[i][0])
            times = []
            for i in range(reps):
                ids, tw = pool[i % 16]
                t0 = time.perf_counter()
                moe_cpu.fused_experts(x, w13, w2, tw, ids)
                times.append(time.perf_counter() - t0)
            s = statistics.median(times)
            tps = M / s
            base.setdefault(M, tps)  # t = 1 comes first
            cells.append(f"{tps:12.1f} {tps / (t * base[M]):5.2f}")
            if M == 1:
                dec_gbs = K * per_expert / s / 1e9
        bw = buf.read_gbs(t, 3)
        share = f"{dec_gbs:10.1f}  {dec_gbs / bw:5.2f}" if dec_gbs else f"{'-':>10}  {'-':>5}"
        line = f"  {t:7d} | " + " | ".join(cells) + f" | {bw:9.1f}  {share}"
        print(line, flush=True)
        lines.append(line)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
