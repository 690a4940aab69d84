"""What A8 activation blocks cost: time of each GGUF weight form with blocks of 32 against per-token activations.

Each form packed twice from the same codes, per token and with the block a GGUF layer runs by default (32: ggml's
Q8_0, finer than its Q8_K for the K-quants and IQ4_XS; docs/numerics.md "Activation blocks"), called in
alternating order in each round on one Qwen3-30B-A3B layer with the same routing; the median of the per-round
time ratios (blocks / per token) is reported, robust to this shared host's drift, with the median times.

    python bench/studies/act_blocks_ab.py [--m 1,128,512] [--reps 15] [--forms q4_0,q8_0,...] [--threads 2]
    python bench/studies/act_blocks_ab.py --forms q4_0 --m 1 --reps 1 --experts 8      # a quick check
"""
import argparse
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu.bench.random_forms import KSCALES, kquant_mins, kquant_scales
from moe_cpu.forms import IQ4_NL_VALUES, UNSIGNED4
from moe_cpu._argtypes import token_counts

# form -> (int4?, group, codebook, mins, the activation block a GGUF layer of it runs)
FORMS = {
    "q4_0": (True, 32, None, False, 32),
    "q8_0": (False, 32, None, False, 32),
    "q4_k": (True, 32, UNSIGNED4, True, 32),
    "iq4_xs": (True, 32, IQ4_NL_VALUES, False, 32),
    "q5_k": (False, 32, None, True, 32),
    "q6_k": (False, 16, None, False, 32),
    "int4_g128": (True, 128, None, False, 32),   # a g128 checkpoint asked for blocks of 32 (pieces)
}


def pack_pair(rng, form, E, N, K):
    """(per token, with the block) PackedExperts of the same random codes."""
    int4, g, cb, mins, block = FORMS[form]
    s = (kquant_scales(rng, E, N, K // g, *KSCALES[form]) if form in KSCALES
         else rng.random((E, N, K // g), dtype=np.float32) * 0.01)
    m = kquant_mins(rng, E, N, K // g) if mins else None
    if not int4:
        q = rng.integers(-32, 32, (E, N, K), dtype=np.int8)
        return tuple(moe_cpu.pack_int8(q, s, g, mins=m, act_block=b) for b in (None, block))
    if cb is None:
        q = rng.integers(-8, 8, (E, N, K), dtype=np.int8)
        return tuple(moe_cpu.pack_int4(q, s, g, act_block=b) for b in (None, block))
    u = rng.integers(0, 16, (E, N, K), dtype=np.uint8)
    return tuple(moe_cpu.pack_int4(u, s, g, codebook=cb, mins=m, act_block=b) for b in (None, block))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=token_counts, default="1,128,512", help="token counts (default 1,128,512)")
    ap.add_argument("--reps", type=int, default=15, help="paired rounds (default 15)")
    ap.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated (default {','.join(FORMS)})")
    ap.add_argument("--threads", type=int, default=None, help="moe_cpu threads (default: its own)")
    ap.add_argument("--experts", type=int, default=128, help="experts in the layer (default 128; at least top-k 8)")
    a = ap.parse_args(argv)
    E, H, I, k = a.experts, 2048, 768, 8
    forms = a.forms.split(",")
    bad = [f for f in forms if f not in FORMS]
    if bad:
        ap.error(f"--forms: unknown {bad[0]!r}; choose from {', '.join(FORMS)}")
    Ms = a.m
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    if E < k:
        ap.error(f"--experts {E} must be >= the top-k of {k}")
    if a.threads is not None:
        try:
            moe_cpu.set_num_threads(a.threads)
        except ValueError as e:
            ap.error(f"--threads: {e}")
    rng = np.random.default_rng(0)
    print(f"moe_cpu {moe_cpu.__version__}, ISA {moe_cpu.cpu_features()['isa']}, {moe_cpu.get_num_threads()} threads; "
          f"Qwen3-30B-A3B layer (E {E}, H {H}, I {I}, top-{k}); blocks / per token, median of {a.reps} paired rounds")
    print(f"{'form':<10} {'block':>5} {'M':>5} {'per token ms':>13} {'blocks ms':>10} {'ratio':>6}  kernel")
    for form in forms:
        w13 = pack_pair(rng, form, E, 2 * I, H)
        w2 = pack_pair(rng, form, E, H, I)
        for M in Ms:
            x = rng.standard_normal((M, H), dtype=np.float32)
            times = ([], [])
            ratios = []
            for r in range(a.reps + 1):
                logits = rng.standard_normal((M, E), dtype=np.float32)
                tw, ti = moe_cpu.select_experts(logits, k, renormalize=True)
                t = [0.0, 0.0]
                for v in ((0, 1) if r % 2 else (1, 0)):
                    t0 = time.perf_counter()
                    moe_cpu.fused_experts(x, w13[v], w2[v], tw, ti)
                    t[v] = time.perf_counter() - t0
                if r:   # the first round warms up
                    times[0].append(t[0]), times[1].append(t[1]), ratios.append(t[1] / t[0])
            print(f"{form:<10} {FORMS[form][4]:>5} {M:>5} {1e3 * statistics.median(times[0]):>13.3f} "
                  f"{1e3 * statistics.median(times[1]):>10.3f} {statistics.median(ratios):>6.3f}  {w13[1].kernel}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
