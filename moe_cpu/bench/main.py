"""End-to-end MoE benchmark on model shapes (DESIGN.md section 7), with this machine's limits
measured in the same run.

For each shape, scheme and M it prints the time per call, tokens/s, GB/s of weight traffic and
GOPS, and the ratios to the measured read bandwidth and to the peak of the instruction the scheme's
kernel is made of (PEAK_INSN: tdpbssd / tdpbf16ps tiles on AMX, vpdpbusd / vdpbf16ps zmm on AVX-512,
{vex} vpdpbusd ymm on AVX-VNNI, vpmaddubsw + vpmaddwd + vpaddd and vfmadd231ps ymm on AVX2; none for
the reference kernels), and %roof: the roofline max(weight bytes / read bandwidth, ops / peak) over the time. Decode (M=1) weights are
cold: each call routes to experts not used in the previous E/k calls, and every layer is larger
than 4x the L3. The decode ratio is the median of five interleaved (bandwidth, decode) pairs; for
M >= 256 the paired peak ratio is likewise the median of five (instruction peak, one call) pairs.
Writes OUT/bench_moe.json and OUT/bench_moe.png (matplotlib, optional).

    moe-cpu bench                       # everything (a few minutes); also python bench/bench_moe.py
    moe-cpu bench --quick               # Qwen3 shape, M = 1, 16, 256
    moe-cpu bench --shapes qwen3-30b-a3b --experts 16 --m 1,4 --schemes int8_w8a8 --no-peers
    moe-cpu bench --kt-peer ...         # also kt-kernel (pip install kt-kernel==0.7.2 --no-deps)
    moe-cpu bench --onednn-peer ...     # also oneDNN through torch: bf16 and dynamic int8 Linear per expert
    moe-cpu bench --amx-crossover ...   # AMX hosts: rows per expert from which the tiles win
    moe-cpu bench --decode [--schemes ...] [--rounds 5]   # decode hot and cold beside the read bandwidth (decode.py)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from .. import _core, api as moe_cpu
from .._argtypes import at_least
from .amx import amx_crossover
from .decode import DECODE_ROWS, decode_hot_cold
from .kt_peer import kt_peer
from .onednn_peer import onednn_peer
from .peaks import Peaks, peak_insn, tier
from .peers import peers, torch_peer
from .random_forms import FORMS, GGUF_ROWS, random_codes, scheme_of
from .shapes import MS, SHAPES
from .timing import Routing, timed, weight_bytes


def _available_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 where unknown: no check)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# Bytes per weight at the peak of packing: the random codes (int8, or bf16 bits) plus the packed copy.
_PEAK_BYTES = {"int4_w4a8": 1.5, "int8_w8a8": 2.0, "fp8_w8a16": 2.0, "bf16": 4.0, "int4_w4a16": 1.5, "int8_w8a16": 2.0}


def check_plan(args) -> None:
    """Refuse, before measuring anything, a run that cannot finish: too few experts for a shape's top-k,
    or weights that do not fit the memory available now."""
    if args.experts < 0:
        raise ValueError(f"--experts {args.experts} must be >= 0 (0: each shape's own)")
    avail = _available_bytes()
    for shape in args.shapes:
        H, I, _, k, E, _ = SHAPES[shape]
        E = args.experts or E
        if k > E:
            raise ValueError(f"--experts {E} is below the {shape} top-k of {k}")
        for scheme in args.schemes:
            need = E * 3 * I * H * _PEAK_BYTES[scheme_of(scheme)]
            if avail and need > avail:
                raise ValueError(f"{shape} {scheme} with {E} experts needs about {need / 2**30:.1f} GiB for its "
                                 f"weights (codes and packed), but {avail / 2**30:.1f} GiB are available")


def run(args):
    check_plan(args)
    rng = np.random.default_rng(0)
    threads = moe_cpu.get_num_threads()
    buf = _core.ReadBuffer(1 << 30)
    peaks = Peaks(threads)
    kernels = moe_cpu.cpu_features()["kernels"]
    for scheme in args.schemes:
        peaks.of(kernels[scheme_of(scheme)])
    limits = {"threads": threads, "tier": tier(), "read_gbs": buf.read_gbs(threads, 3), "peaks_tops": peaks.tops}
    named = ", ".join(f"{peaks.what[n]} {t:.2f} TOPS" for n, t in peaks.tops.items())
    print(f"machine: {threads} threads, tier {limits['tier']}, read {limits['read_gbs']:.1f} GB/s, "
          f"{named or 'no SIMD peak (the reference kernels run no SIMD instruction to measure): %peak not given'}")
    rows = []
    for shape in args.shapes:
        H, I, E_model, k, E, note = SHAPES[shape]
        if args.experts:
            E, note = args.experts, f"E set to {args.experts}"
        act = "swigluoai" if shape.startswith("gpt-oss") else "silu"
        for scheme in args.schemes:
            pack13, pack2 = random_codes(rng, scheme, E, 2 * I, H), random_codes(rng, scheme, E, H, I)
            t0 = time.perf_counter()
            w13, w2 = pack13(), pack2()
            pack_s = time.perf_counter() - t0  # into memory this process had not touched yet
            del w13, w2
            t0 = time.perf_counter()
            w13, w2 = pack13(), pack2()
            repack_s = time.perf_counter() - t0  # into the memory just freed
            del pack13, pack2
            b13 = rng.standard_normal((E, 2 * I), dtype=np.float32) * 0.01 if act == "swigluoai" else None
            b2 = rng.standard_normal((E, H), dtype=np.float32) * 0.01 if act == "swigluoai" else None
            route = Routing(rng, E, k)
            print(f"\n{shape} (H={H} I={I} E={E} k={k}{', ' + note if note else ''}) {scheme}: kernel {w13.kernel} "
                  f"(%peak of {peaks.what.get(peak_insn(w13.kernel), 'no SIMD peak')}), "
                  f"{(w13.nbytes + w2.nbytes) / 2**20:.0f} MiB, packed at {(w13.nbytes + w2.nbytes) / pack_s / 1e9:.2f} GB/s "
                  f"(fresh memory), {(w13.nbytes + w2.nbytes) / repack_s / 1e9:.2f} GB/s (memory reused)")
            print(f"{'M':>5} {'ms/call':>9} {'tok/s':>9} {'GB/s':>7} {'%bw':>5} {'GOPS':>8} {'%peak':>6} {'%roof':>6}")
            for M in args.ms:
                x = rng.standard_normal((M, H), dtype=np.float32)
                tw = np.full((M, k), 1.0 / k, np.float32)
                calls = [route.next(M) for _ in range(64)]
                state = {"i": 0}

                def call():
                    ids = calls[state["i"] % len(calls)]
                    state["i"] += 1
                    moe_cpu.fused_experts(x, w13, w2, tw, ids, activation=act, w13_bias=b13, w2_bias=b2)

                t = timed(call)
                gb = float(np.mean([weight_bytes(w13, w2, c) for c in calls]))
                ops = 2.0 * M * k * (2 * I * H + H * I)
                r = dict(shape=shape, scheme=scheme, kernel=w13.kernel, M=M, ms=t * 1e3, tok_s=M / t,
                         gbs=gb / t / 1e9, gops=ops / t / 1e9, pack_gbs=(w13.nbytes + w2.nbytes) / pack_s / 1e9,
                         repack_gbs=(w13.nbytes + w2.nbytes) / repack_s / 1e9)
                insn, peak = peaks.of(w13.kernel)
                r["pct_bw"] = 100 * r["gbs"] / limits["read_gbs"]
                r["peak_insn"] = insn
                r["pct_peak"] = 100 * r["gops"] / (peak * 1e3) if peak else None
                # roofline: the weight bytes at the read bandwidth, or the ops at the instruction peak, whichever is longer
                r["roofline_ms"] = 1e3 * max(gb / (limits["read_gbs"] * 1e9), ops / (peak * 1e12) if peak else 0.0)
                r["pct_roofline"] = 100 * r["roofline_ms"] / r["ms"]
                if M == 1:  # five interleaved (bandwidth, decode) pairs
                    ratios = []
                    for _ in range(5):
                        bw = buf.read_gbs(threads, 1)
                        ratios.append((gb / timed(call, 0.2) / 1e9) / bw)
                    r["decode_ratio_median"] = statistics.median(ratios)
                    r["decode_ratios"] = ratios
                if M >= 256 and insn:  # five interleaved (instruction peak, one call) pairs: the host's swings cancel
                    ratios = []
                    for _ in range(5):
                        peak = _core.instruction_peak_tops(insn, threads, 0.1)
                        t0 = time.perf_counter()
                        call()
                        ratios.append(ops / (time.perf_counter() - t0) / 1e12 / peak)
                    r["peak_ratio_median"] = statistics.median(ratios)
                    r["peak_ratios"] = ratios
                rows.append(r)
                extra = f"  paired decode ratio {100 * r['decode_ratio_median']:.0f}%" if M == 1 else ""
                extra = f"  paired peak ratio {100 * r['peak_ratio_median']:.1f}%" if "peak_ratio_median" in r else extra
                pct = f"{r['pct_peak']:>6.1f}" if r["pct_peak"] is not None else f"{'-':>6}"
                print(f"{M:>5} {r['ms']:>9.3f} {r['tok_s']:>9.0f} {r['gbs']:>7.1f} {r['pct_bw']:>5.0f} {r['gops']:>8.0f} "
                      f"{pct} {r['pct_roofline']:>6.1f}{extra}")
            del w13, w2
    return limits, rows


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (shape, scheme) in sorted({(r["shape"], r["scheme"]) for r in rows}):
        rs = [r for r in rows if r["shape"] == shape and r["scheme"] == scheme]
        ms = [r["M"] for r in rs]
        axes[0].plot(ms, [r["gbs"] for r in rs], marker="o", label=f"{shape} {scheme}")
        axes[1].plot(ms, [r["gops"] for r in rs], marker="o", label=f"{shape} {scheme}")
    for ax, t in zip(axes, ("weight GB/s", "GOPS")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens M")
        ax.set_ylabel(t)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _csv(choices, name):
    def parse(s):
        items = [x for x in s.split(",") if x]
        bad = [x for x in items if x not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"{name}: unknown {bad or s!r}; choose from {', '.join(choices)}")
        return items
    return parse


def _m_list(s):
    try:
        ms = [int(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--m: expected token counts like 1,16,256, got {s!r}") from None
    if not ms or min(ms) < 1:
        raise argparse.ArgumentTypeError(f"--m: token counts must be >= 1, got {s!r}")
    return ms


def _decode_main(p, a, argv) -> int:
    """``moe-cpu bench --decode``: hot / cold decode of every form (decode.py)."""
    given = {x.split("=")[0] for x in argv}
    if a.m or a.quick or a.gguf or a.kt_peer or a.amx_crossover or a.torch_peer_only or a.onednn_peer:
        p.error("--decode measures M = 1 alone: it takes --shapes, --schemes, --experts, --rounds and --out")
    if "--schemes" not in given:
        a.schemes = DECODE_ROWS
    if "--shapes" not in given:
        a.shapes = ["qwen3-30b-a3b"]
    try:
        check_plan(a)
        for shape in a.shapes:  # cold needs experts that are not the previous call's
            k, E = SHAPES[shape][3], a.experts or SHAPES[shape][4]
            if E < 2 * k:
                raise ValueError(f"--decode needs at least 2k = {2 * k} experts for {shape} (cold calls route to experts "
                                 f"the previous call did not use), got --experts {E}")
        os.makedirs(a.out, exist_ok=True)
    except ValueError as e:
        print(f"moe-cpu bench: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"moe-cpu bench: error: --out {a.out!r} cannot be created: {e.strerror}", file=sys.stderr)
        return 2
    rows = decode_hot_cold(np.random.default_rng(0), a.shapes, a.schemes, a.rounds, a.experts)
    with open(os.path.join(a.out, "bench_decode.json"), "w") as f:
        json.dump({"features": moe_cpu.cpu_features(), "rows": rows}, f, indent=1)
    print(f"wrote {os.path.join(a.out, 'bench_decode.json')}")
    return 0


def main(argv=None) -> int:
    """Run the benchmark (``moe-cpu bench``); returns the exit status."""
    p = argparse.ArgumentParser(prog="moe-cpu bench", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", type=_csv(list(SHAPES), "--shapes"), default=list(SHAPES))
    p.add_argument("--schemes", type=_csv(list(moe_cpu.SCHEMES) + list(FORMS), "--schemes"), default=list(moe_cpu.SCHEMES),
                   help="schemes, and checkpoint forms: " + ", ".join(FORMS))
    p.add_argument("--gguf", action="store_true", help="the GGUF form rows: " + ",".join(GGUF_ROWS))
    p.add_argument("--m", type=_m_list, default=None, help="token counts, e.g. 1,16,256")
    p.add_argument("--experts", type=int, default=0, help="use this many experts for every shape (0: the table's)")
    p.add_argument("--quick", action="store_true", help="Qwen3 shape, M = 1, 16, 256")
    p.add_argument("--no-peers", action="store_true", help="skip the reference / NumPy / torch comparisons")
    p.add_argument("--torch-peer-only", action="store_true",
                   help="of the comparisons, only torch's (bf16 scheme; where torch is installed)")
    p.add_argument("--kt-peer", action="store_true",
                   help="also kt-kernel, KTransformers' CPU MoE kernels (an optional ~100 MB wheel: "
                        "pip install kt-kernel==0.7.2 --no-deps): Qwen3 shape, its int8 / int4 / bf16 schemes, "
                        "at --m (default 1,128,1024), with --experts")
    p.add_argument("--onednn-peer", action="store_true",
                   help="also oneDNN through torch (bench only: pip install torch==2.13.0): Qwen3 shape, bf16 F.linear "
                        "and the dynamic int8 Linear (engines onednn, x86) per expert against moe_cpu's bf16 and "
                        "int8_w8a8, same weights and routing, at --m (default 128,1024), with --experts")
    p.add_argument("--amx-crossover", action="store_true",
                   help="where AMX is active: the rows per expert from which the tiles beat their AVX-512 twins "
                        "(--schemes, --experts, default 16)")
    p.add_argument("--decode", action="store_true",
                   help="only decode (M = 1), hot and cold beside the read bandwidth in the same rounds, for every form "
                        "(default --schemes: " + ",".join(DECODE_ROWS) + "; --shapes default qwen3-30b-a3b); "
                        "writes OUT/bench_decode.json")
    p.add_argument("--rounds", type=at_least(1, int, "a positive integer"), default=5, help="--decode: rounds per form (default 5)")
    p.add_argument("--out", default="bench_out", help="output directory (default ./bench_out)")
    a = p.parse_args(argv)
    if a.decode:
        return _decode_main(p, a, sys.argv[1:] if argv is None else argv)
    if a.quick:
        a.shapes, a.m = ["qwen3-30b-a3b"], [1, 16, 256]
    if a.gguf:
        a.schemes = GGUF_ROWS
    a.ms = tuple(a.m or MS)
    try:
        os.makedirs(a.out, exist_ok=True)   # before the run, not after it
    except OSError as e:
        print(f"moe-cpu bench: error: --out {a.out!r} cannot be created: {e.strerror}", file=sys.stderr)
        return 2
    try:
        limits, rows = run(a)
        peer_rows = [] if a.no_peers or a.torch_peer_only else peers(a, np.random.default_rng(2))
        torch_rows = [] if a.no_peers else torch_peer(np.random.default_rng(3), limits["threads"])
        kt_rows = (kt_peer(np.random.default_rng(4), limits["threads"], a.m or (1, 128, 1024), a.schemes,
                           a.experts or None) if a.kt_peer else [])
        onednn_rows = (onednn_peer(np.random.default_rng(6), limits["threads"], a.m or (128, 1024), a.experts or None)
                       if a.onednn_peer else [])
        amx_rows = (amx_crossover(np.random.default_rng(5), [s for s in a.schemes if s in moe_cpu.SCHEMES],
                                  experts=a.experts or 16) if a.amx_crossover else [])
    except ValueError as e:
        print(f"moe-cpu bench: error: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(a.out, "bench_moe.json"), "w") as f:
        json.dump({"limits": limits, "features": moe_cpu.cpu_features(), "rows": rows, "peers": peer_rows,
                   "torch_peer": torch_rows, "kt_peer": kt_rows, "onednn_peer": onednn_rows,
                   "amx_crossover": amx_rows}, f, indent=1)
    try:
        plot(rows, os.path.join(a.out, "bench_moe.png"))
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'moe_cpu[bench]')")
    print(f"wrote {os.path.join(a.out, 'bench_moe.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
