"""Expert-parallel model of a DeepSeek-V3 layer on 2, 4 and 8 hosts: expert compute against the all-reduce (ms).

A model, not a measurement (docs/performance.md, "Expert parallelism over MPI"): a markdown table of hosts x link x M.

per-layer time = max over hosts of expert compute + all-reduce of M x H x 4 bytes (fp32).
Assumptions (stated, not measured here): a host streams int4 weights at MEM_GBS in decode and runs
W4A8 at HOST_TOPS in prefill; MPI latency ALPHA_US per message step across the switch; links at
LINK_EFF of their line rate. Open MPI's all-reduce: recursive doubling for small messages
(log2 p steps of the whole message), ring for large (2(p-1) steps of n/p); the model takes the faster.
Decode (M = 1): the 8 routed experts land on hosts at random; the slowest host holds the expected
maximum (sampled), rank 0 also runs the shared expert.

    python bench/studies/ep_model.py [--trials 20000]
    python bench/studies/ep_model.py --trials 100                                      # a quick check
"""
import argparse
import math

import numpy as np

H, I, E, K = 7168, 2048, 256, 8
EXPERT_BYTES = 3 * H * I * (0.5 + 2 / 128)     # int4 codes + fp32 scales per group of 128
EXPERT_OPS = 2 * 3 * H * I                      # per token row
MEM_GBS, HOST_TOPS, ALPHA_US, LINK_EFF = 350.0, 20.0, 10.0, 0.8


def allreduce_s(n_bytes, p, link_gbps):
    bw = link_gbps / 8 * 1e9 * LINK_EFF
    a = ALPHA_US * 1e-6
    rd = math.log2(p) * (a + n_bytes / bw)
    ring = 2 * (p - 1) * (a + n_bytes / p / bw)
    return min(rd, ring)


def decode_max_experts(p, trials, rng):
    """Expected experts on the busiest host (8 distinct of 256, contiguous split; +1 shared on host 0)."""
    per = E // p
    tot = 0.0
    for _ in range(trials):
        hosts = np.bincount(rng.choice(E, K, replace=False) // per, minlength=p)
        hosts[0] += 1
        tot += hosts.max()
    return tot / trials


def rows(trials=20000):
    rng = np.random.default_rng(0)
    out = []
    for p in (2, 4, 8):
        for link in (100, 400):
            for M in (1, 512):
                if M == 1:
                    comp = decode_max_experts(p, trials, rng) * EXPERT_BYTES / (MEM_GBS * 1e9)
                else:   # balanced: M*k rows spread evenly, + the shared expert's M rows on host 0
                    comp = (M * K / p + M) * EXPERT_OPS / (HOST_TOPS * 1e12)
                ar = allreduce_s(M * H * 4, p, link)
                out.append((p, link, M, comp * 1e3, ar * 1e3, (comp + ar) * 1e3, ar / (comp + ar)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20000, help="decode routings sampled per point (default 20000)")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error("--trials must be >= 1")
    print("| hosts | link | M | expert compute (ms) | all-reduce (ms) | layer (ms) | all-reduce share |")
    print("|---|---|---|---|---|---|---|")
    for p, link, M, c, a, t, s in rows(args.trials):
        print(f"| {p} | {link} Gb/s | {M} | {c:.3f} | {a:.3f} | {t:.3f} | {100 * s:.0f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
