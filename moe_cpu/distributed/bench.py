"""``mpirun -np N moe-cpu bench --ep``: the expert-parallel layer on model shapes, with the time split
into expert compute, the error agreement and the fp32 all-reduce, and an all-reduce latency sweep
(the alpha / beta of the model in docs/performance.md, "Expert parallelism over MPI").

Each rank packs only its own experts from random codes (the values do not change the speed). Every
timed call starts after a barrier; a call's time is the slowest rank's, and the figure is the median
over calls. The all-reduce is timed twice: inside the call (it includes waiting for the slowest
rank) and alone on the same buffer after a barrier (the transfer itself).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .. import api
from ..bench.random_forms import random_codes
from ..bench.shapes import SHAPES
from ._mpi import mpi
from ..router import Router
from .layer import EPMoELayer
from .placement import split_experts
from .threads import place_threads


def _median_of_max(comm, xs):
    """Median over calls of the per-call maximum over ranks."""
    MPI = mpi()
    a = np.array(xs, np.float64)
    comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
    return float(np.median(a))


def allreduce_sweep(comm, sizes, reps=20):
    """Seconds per fp32 Allreduce of n bytes (median of reps, slowest rank), for n in sizes."""
    MPI = mpi()
    out = {}
    for n in sizes:
        buf = np.zeros(max(n // 4, 1), np.float32)
        times = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            times.append(time.perf_counter() - t0)
        out[n] = _median_of_max(comm, times)
    return out


def fit_alpha_beta(sweep):
    """t = alpha + n * beta from the sweep: alpha = the smallest message's time, beta from the largest
    (a least-squares fit is dominated by the large messages and can give a negative alpha)."""
    n = sorted(sweep)
    alpha = sweep[n[0]]
    beta = max(sweep[n[-1]] - alpha, 1e-12) / max(n[-1] - n[0], 1)
    return float(alpha), float(beta)


def bench_shape(comm, name, scheme, ms, calls, experts, exact=False):
    MPI = mpi()
    H, I, E_model, k, E, _ = SHAPES[name]
    E = experts or E
    rank, size = comm.Get_rank(), comm.Get_size()
    pl = split_experts(E, size)
    own = pl[rank]
    rng = np.random.default_rng(100 + rank)
    w13 = random_codes(rng, scheme, len(own), 2 * I, H)()
    w2 = random_codes(rng, scheme, len(own), H, I)()
    gate = np.random.default_rng(1).standard_normal((E, H), dtype=np.float32)
    layer = EPMoELayer(comm, pl, Router(gate, top_k=k), w13, w2, threads=None, exact=exact)
    rows = []
    for M in ms:
        x = np.random.default_rng(2).standard_normal((M, H), dtype=np.float32)
        layer(x)   # warm up
        total, parts, alone = [], [], []
        for i in range(calls):
            xi = np.random.default_rng(3 + i).standard_normal((M, H), dtype=np.float32)  # new routing each call
            comm.Barrier()
            t0 = time.perf_counter()
            layer(xi)
            total.append(time.perf_counter() - t0)
            parts.append(layer.last_times)
            buf = np.zeros((M * (k if exact else 1), H), np.float32)
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            alone.append(time.perf_counter() - t0)
        row = dict(shape=name, scheme=scheme, exact=exact, E=E, E_model=E_model, k=k, H=H, I=I, M=M, ranks=size,
                   threads=api.get_num_threads(), experts_per_rank=[len(p) for p in pl],
                   ms=1e3 * _median_of_max(comm, total),
                   compute_ms=1e3 * _median_of_max(comm, [p[0] for p in parts]),
                   agree_ms=1e3 * _median_of_max(comm, [p[1] for p in parts]),
                   allreduce_in_call_ms=1e3 * _median_of_max(comm, [p[2] for p in parts]),
                   allreduce_alone_ms=1e3 * _median_of_max(comm, alone), allreduce_bytes=buf.nbytes)
        row["allreduce_share"] = row["allreduce_alone_ms"] / row["ms"]
        rows.append(row)
        if rank == 0:
            print(f"{name:<14} {scheme:<10} E={E:<4} ranks={size} threads/rank={row['threads']} M={M:<4} "
                  f"{row['ms']:9.3f} ms/call  compute {row['compute_ms']:9.3f}  agree {row['agree_ms']:.3f}  "
                  f"all-reduce in call {row['allreduce_in_call_ms']:.3f}, alone {row['allreduce_alone_ms']:.3f} ms "
                  f"({100 * row['allreduce_share']:.1f}% of the call, {buf.nbytes} B){' exact' if exact else ''}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="moe-cpu bench --ep", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v3")
    p.add_argument("--m", default="1,512", help="token counts")
    p.add_argument("--schemes", default="int4_w4a8")
    p.add_argument("--experts", type=int, default=0, help="experts per layer (0: bench.SHAPES' value)")
    p.add_argument("--calls", type=int, default=7, help="timed calls per point")
    p.add_argument("--sweep", default="4,1024,65536,1048576,4194304,16777216",
                   help="all-reduce sizes in bytes for the alpha/beta fit ('' to skip)")
    p.add_argument("--exact", action="store_true", help="also time exact=True (bit-identical mode) at each point")
    p.add_argument("--out", default="bench_out")
    a = p.parse_args(argv)
    MPI = mpi()
    comm = MPI.COMM_WORLD
    shapes = a.shapes.split(",")
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        print(f"moe-cpu bench --ep: error: unknown shape {bad[0]} (one of {', '.join(SHAPES)})", file=sys.stderr)
        return 2
    threads = place_threads(comm)
    if comm.Get_rank() == 0:
        print(f"moe-cpu bench --ep: {comm.Get_size()} ranks, {threads} threads per rank, "
              f"{MPI.Get_library_version().splitlines()[0]}", flush=True)
    rows = []
    for shape in shapes:
        for scheme in a.schemes.split(","):
            for exact in ((False, True) if a.exact else (False,)):
                rows += bench_shape(comm, shape, scheme, [int(m) for m in a.m.split(",")], a.calls, a.experts, exact)
    sweep = allreduce_sweep(comm, [int(s) for s in a.sweep.split(",")]) if a.sweep else {}
    fit = fit_alpha_beta(sweep) if len(sweep) >= 2 else (None, None)
    if comm.Get_rank() == 0:
        for n, t in sweep.items():
            print(f"all-reduce {n:>9} B: {t * 1e6:10.2f} us")
        if fit[0] is not None:
            print(f"fit t = alpha + n * beta: alpha = {fit[0] * 1e6:.2f} us, 1/beta = {1e-9 / fit[1]:.2f} GB/s")
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, f"bench_ep_{comm.Get_size()}ranks.json")
        with open(path, "w") as f:
            json.dump({"rows": rows, "allreduce_sweep": {str(n): t for n, t in sweep.items()},
                       "alpha_s": fit[0], "beta_s_per_byte": fit[1], "ranks": comm.Get_size(),
                       "median_of": a.calls, "statistic": "median over calls of the slowest rank"}, f, indent=1)
        print(f"wrote {path}")
    return 0
