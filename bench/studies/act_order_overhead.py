"""Run-time cost of GPTQ act-order: time of int4 layers with g_idx (w13, w13+w2) against the same codes without.

docs/performance.md. One MoE layer of int4 weights with zero points, group 128, packed three ways from the same
codes:
  plain   - no g_idx (contiguous groups);
  w13     - w13 act-order (each routed row gathers its int8 codes), w2 folded into w13's rows (free);
  w13+w2  - both gathered at run time (what an unfolded w2 g_idx costs).
Calls are interleaved (plain, w13, w13+w2, plain, ...), each round with a new random routing; the
medians are compared, and so is the median of the per-round ratios (paired). Decode (M <= 16) runs 20x
the rounds.

    python bench/studies/act_order_overhead.py [--shape qwen3-30b-a3b] [--m 1,1024] [--reps 15]
    python bench/studies/act_order_overhead.py --shape small --m 1 --reps 1          # a quick check
"""
import argparse
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu._argtypes import token_counts

SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "small": (16, 512, 256, 4)}   # E, H, I, k


def weights(rng, E, N, K, g):
    q = rng.integers(0, 16, (E, N, K), dtype=np.uint8)
    z = rng.integers(6, 11, (E, N, K // g), dtype=np.uint8)
    s = (rng.uniform(0.5, 1.5, (E, N, K // g)) / (4 * np.sqrt(K))).astype(np.float32)
    gi = np.empty((E, K), np.int32)
    for e in range(E):
        gi[e, rng.permutation(K)] = np.arange(K) // g
    return q, s, z, gi


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--m", type=token_counts, default="1,1024", help="token counts (default 1,1024)")
    ap.add_argument("--reps", type=int, default=15, help="rounds (20x at M <= 16; default 15)")
    ap.add_argument("--group", type=int, default=128, help="int4 group size (default 128)")
    a = ap.parse_args(argv)
    E, H, I, k = SHAPES[a.shape]
    Ms = a.m
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    if a.group < 1 or H % a.group or I % a.group:
        ap.error(f"--group {a.group} must divide H {H} and I {I}")
    g, rng = a.group, np.random.default_rng(0)
    q13, s13, z13, g13 = weights(rng, E, 2 * I, H, g)
    q2, s2, z2, g2 = weights(rng, E, H, I, g)
    layers = {
        "plain": (moe_cpu.pack_int4(q13, s13, g, z13), moe_cpu.pack_int4(q2, s2, g, z2)),
        "w13": (moe_cpu.pack_int4(q13, s13, g, z13, g_idx=g13), moe_cpu.pack_int4(q2, s2, g, z2)),
        "w13+w2": (moe_cpu.pack_int4(q13, s13, g, z13, g_idx=g13), moe_cpu.pack_int4(q2, s2, g, z2, g_idx=g2)),
    }
    del q13, q2
    print(f"shape {a.shape}: E={E} H={H} I={I} k={k}, int4 g{g} with zero points, "
          f"{moe_cpu.get_num_threads()} threads, kernel {layers['plain'][0].kernel}")
    for M in Ms:
        x = rng.standard_normal((M, H)).astype(np.float32)
        times = {n: [] for n in layers}
        reps = a.reps * (20 if M <= 16 else 1)   # decode calls are short and noisy: more rounds
        for rep in range(reps + 1):   # a new routing per round (decode reads other experts each token)
            logits = rng.standard_normal((M, E)).astype(np.float32)
            tw, ids = moe_cpu.select_experts(logits, k, renormalize=True)
            for n, (w13, w2) in layers.items():
                if rep == 0:    # warm-up round
                    moe_cpu.fused_experts(x, w13, w2, tw, ids)
                    continue
                t0 = time.perf_counter()
                moe_cpu.fused_experts(x, w13, w2, tw, ids)
                times[n].append(time.perf_counter() - t0)
        base = statistics.median(times["plain"])
        for n in layers:
            med = statistics.median(times[n])
            paired = statistics.median(t / p for t, p in zip(times[n], times["plain"]))
            print(f"M={M:5d} {n:7s} median {med * 1e3:9.3f} ms  ratio to plain {med / base:6.3f}  "
                  f"paired {paired:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
