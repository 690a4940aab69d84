"""transformers' Qwen3MoeSparseMoeBlock patched onto moe_cpu against the same block on torch CPU: time and error.

Qwen3-30B-A3B's MoE block (H=2048, moe_intermediate=768, E=128 or --experts, top_k=8) with random bf16 weights, at
M = 1 and M = 512 tokens. Unpatched: transformers' experts implementations "eager" (the per-expert loop)
and "grouped_mm" (what transformers 5 picks on the CPU). Patched: MoECPUBlock.from_block (what
integrations.transformers.patch installs) per scheme, with the block's router. Variants are timed in
interleaved rounds (median per variant), so host drift hits all alike; each round has a new input, so a
decode call meets other experts than the last (not weights left in L3).

Needs torch and transformers (peers of this bench only: pip install torch transformers).

    python3 bench/bench_transformers_patch.py [--threads 2] [--rounds-decode 30] [--rounds-prefill 5]
    python3 bench/bench_transformers_patch.py --experts 8 --m 1 --rounds-decode 1 --schemes bf16   # a quick check
"""
import argparse
import platform
import subprocess
import time

import numpy as np

import moe_cpu
from moe_cpu._argtypes import token_counts

H, I, E, K = 2048, 768, 128, 8
SCHEMES = {"bf16": None, "int4_w4a8": 128, "int8_w8a8": None, "fp8_w8a16": None}   # scheme -> group size
torch = transformers = Qwen3MoeConfig = Qwen3MoeSparseMoeBlock = MoECPUBlock = None   # the peers, imported by main


def import_peers() -> None:
    global torch, transformers, Qwen3MoeConfig, Qwen3MoeSparseMoeBlock, MoECPUBlock
    import torch
    import transformers
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from moe_cpu.integrations.transformers import MoECPUBlock


def host() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in lscpu.splitlines() if ln.startswith("Flags")), []))
    isa = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx_vnni")) or f == "avx2")
    return (f"{model}, {platform.machine()}, flags {' '.join(isa)}; torch {torch.__version__} "
            f"(cpu capability {torch.backends.cpu.get_cpu_capability()}), transformers {transformers.__version__}, "
            f"moe_cpu kernels {moe_cpu.cpu_features()['kernels']}")


def block(E: int) -> tuple:
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=True, hidden_act="silu")
    b = Qwen3MoeSparseMoeBlock(cfg).to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        b.gate.weight.copy_(torch.randn(E, H, generator=g) * H ** -0.5)
        b.experts.gate_up_proj.copy_(torch.randn(E, 2 * I, H, generator=g, dtype=torch.bfloat16) * H ** -0.5)
        b.experts.down_proj.copy_(torch.randn(E, H, I, generator=g, dtype=torch.bfloat16) * I ** -0.5)
    return b, cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch and moe_cpu threads (default 2)")
    ap.add_argument("--rounds-decode", type=int, default=30, help="timed rounds at M <= 16 (default 30)")
    ap.add_argument("--rounds-prefill", type=int, default=5, help="timed rounds above (default 5)")
    ap.add_argument("--m", type=token_counts, default="1,512", help="token counts (default 1,512)")
    ap.add_argument("--experts", type=int, default=E, help=f"experts in the block (default {E}; at least top-k {K})")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help=f"moe_cpu schemes (default {','.join(SCHEMES)})")
    a = ap.parse_args(argv)
    Ms = a.m
    if a.rounds_decode < 1 or a.rounds_prefill < 1:
        ap.error("--rounds-decode and --rounds-prefill must be >= 1")
    if a.experts < K:
        ap.error(f"--experts {a.experts} must be >= the top-k of {K}")
    schemes = a.schemes.split(",")
    bad = [s for s in schemes if s not in SCHEMES]
    if bad:
        ap.error(f"--schemes: unknown {bad[0]!r}; choose from {', '.join(SCHEMES)}")
    try:
        moe_cpu.set_num_threads(a.threads)
    except ValueError as e:
        ap.error(f"--threads: {e}")
    try:
        import_peers()
    except ImportError as e:
        ap.error(f"needs torch and transformers with Qwen3-MoE (pip install torch transformers): {e}")
    torch.set_num_threads(a.threads)
    print(f"host: {host()}\nthreads: torch {torch.get_num_threads()}, moe_cpu {moe_cpu.get_num_threads()}")
    b, cfg = block(a.experts)
    variants = {}
    for impl in ("eager", "grouped_mm"):
        def run(x, impl=impl):
            cfg._experts_implementation = impl
            return b(x)
        variants[f"transformers {impl}"] = run
    for scheme in schemes:
        t = time.perf_counter()
        p = MoECPUBlock.from_block(b, cfg, scheme, group_size=SCHEMES[scheme])
        print(f"patched {scheme}: {p.layer.nbytes / 2**20:.0f} MiB packed in {time.perf_counter() - t:.1f} s, "
              f"kernel {p.layer.w13.kernel}")
        variants[f"moe_cpu {scheme}"] = p
    print("\n| M | variant | ms median (min) | vs transformers eager | vs transformers grouped_mm | rel L2 vs eager |")
    print("|---|---|---|---|---|---|")
    for M in Ms:
        rounds = a.rounds_decode if M <= 16 else a.rounds_prefill
        g = torch.Generator().manual_seed(M)
        xs = [torch.randn(1, M, H, generator=g).to(torch.bfloat16) for _ in range(rounds + 1)]
        times = {k: [] for k in variants}
        with torch.no_grad():
            outs = {k: f(xs[0]) for k, f in variants.items()}        # warm-up, and the outputs compared
            for x in xs[1:]:   # a new input per round: other experts, not the ones left in cache
                for k, f in variants.items():
                    t = time.perf_counter()
                    f(x)
                    times[k].append(time.perf_counter() - t)
        want = outs["transformers eager"].float()
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        for k in variants:
            err = float((outs[k].float() - want).norm() / want.norm())
            eager, grouped = med["transformers eager"] / med[k], med["transformers grouped_mm"] / med[k]
            print(f"| {M} | {k} | {med[k]:.2f} ({min(times[k]) * 1e3:.2f}) | {eager:.2f}x | {grouped:.2f}x | "
                  f"{err:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
