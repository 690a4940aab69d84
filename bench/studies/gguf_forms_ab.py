"""Time of GGUF weight forms against the plain kernel each is held to, interleaved in one run.

docs/performance.md. q4_k / iq4_xs / mxfp4 against int4_g32 (the plain int4 kernel at group 32), q6_k / q5_k
against int8_w8a8 per channel. Each round calls every form once on one Qwen3-30B-A3B layer (128 experts or
--experts) with the same new routing; the median of the per-round time ratios is reported (robust to this shared
host's drift), with the medians.

    python bench/studies/gguf_forms_ab.py [--m 1024] [--reps 15] [--forms q4_k,q6_k,...]
    python bench/studies/gguf_forms_ab.py --m 1 --reps 1 --forms q4_k --experts 8     # a quick check
"""
import argparse
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu.forms import UNSIGNED4
from moe_cpu.bench.random_forms import kquant_mins, random_codes

BASE = {"q4_k": "int4_g32", "q4_k_float_mins": "int4_g32", "iq4_xs": "int4_g32", "mxfp4": "int4_g32",
        "q6_k": "int8_w8a8", "q5_k": "int8_w8a8"}


def q4k_float_mins(rng, E, N, K):
    """q4_k with every min nudged by one ulp: they no longer factor as dmin * int, so every kernel takes
    them as floats (one FMA per group); what the integer mins save."""
    g = 32
    u = rng.integers(0, 16, (E, N, K), dtype=np.uint8)
    s = rng.random((E, N, K // g), dtype=np.float32) * 0.01
    m = np.nextafter(kquant_mins(rng, E, N, K // g), np.float32(1))
    return moe_cpu.pack_int4(u, s, g, codebook=UNSIGNED4, mins=m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=1024, help="tokens per call (default 1024)")
    ap.add_argument("--reps", type=int, default=15, help="rounds (default 15)")
    ap.add_argument("--forms", default=",".join(BASE), help=f"comma-separated (default {','.join(BASE)})")
    ap.add_argument("--experts", type=int, default=128, help="experts in the layer (default 128; at least top-k 8)")
    a = ap.parse_args(argv)
    E, H, I, k = a.experts, 2048, 768, 8
    forms = a.forms.split(",")
    bad = [f for f in forms if f not in BASE]
    if bad:
        ap.error(f"--forms: unknown {bad[0]!r}; choose from {', '.join(BASE)}")
    if a.m < 1:
        ap.error(f"--m {a.m}: the token count must be >= 1")
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    if E < k:
        ap.error(f"--experts {E} must be >= the top-k of {k}")
    names = list(dict.fromkeys([BASE[f] for f in forms] + forms))
    rng = np.random.default_rng(0)
    make = lambda n, N, K: q4k_float_mins(rng, E, N, K) if n == "q4_k_float_mins" else random_codes(rng, n, E, N, K)()
    layers = {n: (make(n, 2 * I, H), make(n, H, I)) for n in names}
    print(f"Qwen3-30B-A3B layer, M={a.m}, {moe_cpu.get_num_threads()} threads; kernels: "
          + ", ".join(f"{n} {w13.kernel}{' (int mins)' if w13.has_int_mins else ''}{' (int scales)' if w13.has_int_scales else ''}"
                     for n, (w13, _) in layers.items()))
    x = rng.standard_normal((a.m, H)).astype(np.float32)
    times = {n: [] for n in names}
    for rep in range(a.reps + 1):
        tw, ids = moe_cpu.select_experts(rng.standard_normal((a.m, E)).astype(np.float32), k, renormalize=True)
        for n in names:
            t0 = time.perf_counter()
            moe_cpu.fused_experts(x, *layers[n], tw, ids)
            if rep:
                times[n].append(time.perf_counter() - t0)
    for f in forms:
        b = BASE[f]
        paired = statistics.median(tb / tf for tf, tb in zip(times[f], times[b]))
        print(f"{f:15s} median {statistics.median(times[f]) * 1e3:8.2f} ms   {b} {statistics.median(times[b]) * 1e3:8.2f} ms"
              f"   speed vs {b}: paired {paired:6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
