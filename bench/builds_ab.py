#!/usr/bin/env python3
"""Time of fused_experts in one build of moe_cpu against another (or one build under two environments), paired.

What it runs
    Two worker processes, one per build (``--old`` / ``--new``: directories that hold a ``moe_cpu`` package, e.g.
    copies of site-packages/moe_cpu), each holding the same MoE block: a GGUF file of bench/ik_peer.py's cache
    (Q4_0, Q8_0, Q4_K, IQ4_XS, Q5_K, Q6_K: the Qwen3-30B-A3B block) or a random block of a scheme
    (int4_w4a8 = g128, int8_w8a8 per channel, ...: moe_cpu.bench.random_forms; ``--experts`` of them, 128 by
    default). ``fused_experts`` on a routing
    pool where an expert comes back every 16 calls (cold decode; ``--hot``: the same experts every call, in cache
    where they fit, to time the kernels' compute). The workers take turns, a batch of calls each
    (the order flips every round), so both see the same phase of the host's memory bandwidth, which on these VMs
    moves by up to 30% within minutes; per-process alternation (load, run, exit) spread 10-20% where this
    spreads 1-2%. ``--layer`` (GGUF cases): the whole ``MoELayer`` call instead, router and top-k included, on 16
    inputs in turn, as bench/ik_peer.py times moe_cpu. ``--act-block`` loads GGUF cases with other activation
    blocks (e.g. 256, ggml's Q8_K).

What it prints
    Per case: the median over rounds of new / old (each round's median call), its quartiles, and both medians (ms).

Usage
    cp -r $(python3 -c 'import moe_cpu,os;print(os.path.dirname(moe_cpu.__file__))') /tmp/old/   # before a change
    ... rebuild, copy the new one to /tmp/new/ ...
    python bench/builds_ab.py --old /tmp/old --new /tmp/new --cases Q4_0,Q4_K,int4_w4a8 --isa avx2
    python bench/builds_ab.py --old /tmp/b --new /tmp/b --new-env MOE_CPU_TEAM=omp     # one build, two settings
    python bench/builds_ab.py --old $SITE --new $SITE --cases int8_w8a8 --experts 8 --rounds 1   # a quick check
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# the random blocks a worker can build (moe_cpu.bench.random_forms: the schemes and the GGUF-like forms)
RANDOM = ("int4_w4a8", "int8_w8a8", "fp8_w8a16", "bf16", "int4_w4a16", "int8_w8a16",
          "int4_g32", "q4_k", "iq4_xs", "mxfp4", "q6_k", "q5_k")

WORKER = r'''
import sys, time
import numpy as np
import moe_cpu
from moe_cpu.bench.timing import routing_pool
case, M, threads, hot, E = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "hot", int(sys.argv[5])
whole = sys.argv[6] == "layer"
act_block = None if sys.argv[7] == "none" else int(sys.argv[7]) if sys.argv[7].isdigit() else sys.argv[7]
rng = np.random.default_rng(0)
if not case.endswith(".gguf"):
    from moe_cpu.bench.random_forms import random_block
    w13, w2 = random_block(rng, case, 2048, 768, E)
else:
    layer = moe_cpu.MoELayer.from_pretrained(case, layer_idx=0, act_block=act_block)
    w13, w2 = layer.w13, layer.w2
    E = w13.num_experts
H = w13.in_features
x = rng.standard_normal((M, H)).astype(np.float32)
pool = routing_pool(rng, E, 8, M)
if hot:
    pool = pool[:1]   # the same experts every call: L3-resident where they fit (compute-bound decode)
moe_cpu.set_num_threads(threads)
if whole:   # the layer's call, router included, on 16 inputs in turn (hot: one)
    xs = [rng.standard_normal((M, H)).astype(np.float32) for _ in range(1 if hot else 16)]
    run = lambda i: layer(xs[i % len(xs)])
else:
    run = lambda i: moe_cpu.fused_experts(x, w13, w2, pool[i % len(pool)][1], pool[i % len(pool)][0])
calls = 150 if M == 1 else 4
i = 0
print("ready", flush=True)
for _ in sys.stdin:
    for _ in range(10 if M == 1 else 1):
        run(i); i += 1
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        run(i); i += 1
        ts.append(time.perf_counter() - t0)
    print(float(np.median(ts)) * 1e3, flush=True)
'''


def env_pairs(text: str) -> dict:
    out = {}
    for kv in filter(None, text.split(",")):
        if "=" not in kv:
            raise ValueError(f"--old-env / --new-env take NAME=VALUE[,NAME=VALUE]: got {kv!r}")
        k, v = kv.split("=", 1)
        out[k] = v
    return out


def gguf_file(work_dir: str, typ: str) -> str:
    """bench/ik_peer.py's cached file of the Qwen3-30B-A3B block quantized to typ."""
    return os.path.join(work_dir, f"q_H2048_E128_I768_k8_s0_f16_{typ}.gguf")


def quartiles(v):
    s = sorted(v)
    return s[len(s) // 4], s[(3 * len(s)) // 4]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="directory holding the old build's moe_cpu package")
    ap.add_argument("--new", required=True, help="directory holding the new build's moe_cpu package")
    ap.add_argument("--cases", default="Q4_0,Q8_0,Q4_K,IQ4_XS,Q5_K,Q6_K",
                    help="GGUF types (bench/ik_peer.py's files) and / or schemes, comma-separated")
    ap.add_argument("--m", type=int, default=1, help="tokens per call (default 1)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default="", help="MOE_CPU_ISA for both (default: native)")
    ap.add_argument("--old-env", default="", help="NAME=VALUE[,...] for the old worker only")
    ap.add_argument("--new-env", default="", help="NAME=VALUE[,...] for the new worker only")
    ap.add_argument("--hot", action="store_true",
                    help="route every call to the same experts (cache-resident where they fit) instead of a cold pool")
    ap.add_argument("--layer", action="store_true",
                    help="time the GGUF cases' whole MoELayer call (router, top-k and experts, as bench/ik_peer.py "
                         "does) on 16 inputs in turn, instead of fused_experts on a routing pool")
    ap.add_argument("--act-block", default="auto",
                    help="GGUF cases: the activation blocks both builds load with (auto, none, 32, 64, 128, 256)")
    ap.add_argument("--work-dir", default="/tmp/ik_peer_models", help="bench/ik_peer.py's GGUF cache")
    ap.add_argument("--experts", type=int, default=128,
                    help="experts of the random blocks (default 128, as the GGUF files; at least top-k 8)")
    a = ap.parse_args(argv)
    if a.m < 1 or a.rounds < 1 or a.threads < 1:
        ap.error("--m, --rounds and --threads must be >= 1")
    if a.experts < 8:
        ap.error(f"--experts {a.experts} must be >= the top-k of 8")
    for d in (a.old, a.new):
        if not os.path.isfile(os.path.join(d, "moe_cpu", "__init__.py")):
            ap.error(f"{d} holds no moe_cpu package")
    try:
        extra = {"old": env_pairs(a.old_env), "new": env_pairs(a.new_env)}
    except ValueError as e:
        ap.error(str(e))
    if a.act_block not in ("auto", "none", "32", "64", "128", "256"):
        ap.error(f"--act-block {a.act_block}: one of auto, none, 32, 64, 128, 256")
    cases = {}   # case -> what the workers load: a scheme / form name, or a GGUF file
    for case in a.cases.split(","):
        if case in RANDOM and a.layer:
            ap.error(f"--layer times a GGUF file's MoELayer: --cases {case} is a random block without a router")
        if case in RANDOM:
            cases[case] = case
        elif os.path.isfile(gguf_file(a.work_dir, case)):
            cases[case] = gguf_file(a.work_dir, case)
        else:
            ap.error(f"--cases {case}: neither a scheme / form ({', '.join(RANDOM)}) nor a GGUF type with a file in "
                     f"{a.work_dir} (bench/ik_peer.py --prepare-only --types {case} writes it)")
    print(f"# old {a.old} {a.old_env}  new {a.new} {a.new_env}  M {a.m}, {a.threads} threads, "
          f"isa {a.isa or 'native'}, {a.rounds} rounds{', hot' if a.hot else ''}{', whole layer' if a.layer else ''}"
          f"{'' if a.act_block == 'auto' else ', activation blocks ' + a.act_block}",
          flush=True)
    for case, what in cases.items():
        procs = {}
        for v, path in (("old", a.old), ("new", a.new)):
            env = dict(os.environ, PYTHONPATH=path, **extra[v])
            if a.isa:
                env["MOE_CPU_ISA"] = a.isa
            procs[v] = subprocess.Popen([sys.executable, "-c", WORKER, what, str(a.m), str(a.threads),
                                         "hot" if a.hot else "cold", str(a.experts), "layer" if a.layer else "experts", a.act_block],
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        try:
            for v, p in procs.items():
                if p.stdout.readline().strip() != "ready":
                    raise SystemExit(f"{case}: the {v} worker failed to start (see its error above)")
            res = {"old": [], "new": []}
            for r in range(a.rounds):
                for v in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    procs[v].stdin.write("go\n")
                    procs[v].stdin.flush()
                    res[v].append(float(procs[v].stdout.readline()))
        finally:
            for p in procs.values():
                p.stdin.close()
                p.wait()
        ratios = [n / o for n, o in zip(res["new"], res["old"])]
        q1, q3 = quartiles(ratios)
        print(f"  {case:10} new/old {statistics.median(ratios):.3f} (quartiles {q1:.3f}-{q3:.3f})  "
              f"old {statistics.median(res['old']):.3f} ms  new {statistics.median(res['new']):.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
