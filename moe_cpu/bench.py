"""End-to-end MoE benchmark on model shapes (DESIGN.md section 7), with this machine's limits
measured in the same run.

For each shape, scheme and M it prints the time per call, tokens/s, GB/s of weight traffic and
GOPS, and the ratios to the measured read bandwidth and to the peak of the instruction the scheme's
kernel is made of (PEAK_INSN: vpdpbusd / vdpbf16ps zmm on AVX-512, {vex} vpdpbusd ymm on AVX-VNNI,
vpmaddubsw + vpmaddwd + vpaddd and vfmadd231ps ymm on AVX2; none for the reference kernels). Decode (M=1) weights are
cold: each call routes to experts not used in the previous E/k calls, and every layer is larger
than 4x the L3. The decode ratio is the median of five interleaved (bandwidth, decode) pairs; for
M >= 256 the paired peak ratio is likewise the median of five (instruction peak, one call) pairs.
Writes OUT/bench_moe.json and OUT/bench_moe.png (matplotlib, optional).

    moe-cpu bench                       # everything (a few minutes); also python bench/bench_moe.py
    moe-cpu bench --quick               # Qwen3 shape, M = 1, 16, 256
    moe-cpu bench --shapes qwen3-30b-a3b --experts 16 --m 1,4 --schemes int8_w8a8 --no-peers
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from . import _core, api as moe_cpu

SHAPES = {  # name: (H, I, E, k, E used here, note)
    "qwen3-30b-a3b": (2048, 768, 128, 8, 128, ""),
    "mixtral-8x7b": (4096, 14336, 8, 2, 8, ""),
    "deepseek-v3": (7168, 2048, 256, 8, 32, "E shrunk 256 -> 32 to fit memory"),
    "gpt-oss-20b": (2880, 2880, 32, 4, 32, "swigluoai, biases"),
}
MS = (1, 4, 16, 64, 256, 1024)
# Checkpoint weight forms (GGUF), benched like schemes: name -> (scheme, group, codebook, mins).
# int4_g32 is the plain int4 kernel at the GGUF group size, the figure the int4 forms are held to.
IQ4_NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
FORMS = {
    "int4_g32": ("int4_w4a8", 32, None, False),
    "q4_k": ("int4_w4a8", 32, tuple(range(16)), True),
    "iq4_xs": ("int4_w4a8", 32, IQ4_NL, False),
    "mxfp4": ("int4_w4a8", 32, (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), False),
    "q6_k": ("int8_w8a8", 16, None, False),
    "q5_k": ("int8_w8a8", 32, None, True),
}
GGUF_ROWS = ["int4_g32", "q4_k", "iq4_xs", "mxfp4", "int8_w8a8", "q6_k", "q5_k"]


def scheme_of(name: str) -> str:
    """The scheme of a bench row name (a scheme or a FORMS entry)."""
    return FORMS[name][0] if name in FORMS else name


def _kquant_mins(rng, E, N, G):
    """Mins as Q4_K / Q5_K hold them: an fp16 dmin per run of 8 groups times 6-bit integers."""
    runs = -(-G // 8)
    d = (rng.random((E, N, runs, 1), dtype=np.float32) * 0.04).astype(np.float16).astype(np.float32)
    m6 = rng.integers(0, 64, (E, N, runs, 8)).astype(np.float32)
    return np.ascontiguousarray((d * m6).reshape(E, N, runs * 8)[:, :, :G])


def _kquant_scales(rng, E, N, G, lo, hi):
    """Scales as K-quants and IQ4_XS hold them: an fp16 d per run of 8 groups times integers in [lo, hi]."""
    runs = -(-G // 8)
    d = (rng.random((E, N, runs, 1), dtype=np.float32) * 0.001).astype(np.float16).astype(np.float32)
    sc = rng.integers(lo, hi + 1, (E, N, runs, 8)).astype(np.float32)
    return np.ascontiguousarray((d * sc).reshape(E, N, runs * 8)[:, :, :G])


# Super-block scale integers of the int4 forms whose files hold them (Q4_K: 6-bit, IQ4_XS: 6-bit - 32).
KSCALES = {"q4_k": (0, 63), "iq4_xs": (-32, 31)}


def random_codes(rng, scheme, E, N, K):
    """Random codes and scales for `scheme`, as a function that packs them (values do not matter for
    speed; no float32 copy). Timing that function times the packing alone."""
    shape = (E, N, K)
    if scheme in FORMS:
        sch, g, cb, with_mins = FORMS[scheme]
        s = (_kquant_scales(rng, E, N, K // g, *KSCALES[scheme]) if scheme in KSCALES
             else rng.random((E, N, K // g), dtype=np.float32) * 0.01)
        m = _kquant_mins(rng, E, N, K // g) if with_mins else None
        if sch == "int8_w8a8":
            q8 = rng.integers(-32, 32, shape, dtype=np.int8)
            return lambda: moe_cpu.pack_int8(q8, s, g, mins=m)
        if cb is None:
            q4 = rng.integers(-8, 8, shape, dtype=np.int8)
            return lambda: moe_cpu.pack_int4(q4, s, g)
        u4 = rng.integers(0, 16, shape, dtype=np.uint8)
        return lambda: moe_cpu.pack_int4(u4, s, g, codebook=cb, mins=m)
    if scheme == "int4_w4a8":
        g = 128 if K % 128 == 0 else 32
        q, s = rng.integers(-8, 8, shape, dtype=np.int8), rng.random((E, N, K // g), dtype=np.float32) * 0.01
        return lambda: moe_cpu.pack_int4(q, s, g)
    if scheme == "int8_w8a8":
        q, s = rng.integers(-127, 128, shape, dtype=np.int8), rng.random((E, N), dtype=np.float32) * 0.01
        return lambda: moe_cpu.pack_int8(q, s)
    if scheme == "fp8_w8a16":
        codes = rng.integers(0, 0x7E, shape, dtype=np.uint8) | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)
        s = rng.random((E, -(-N // 128), -(-K // 128)), dtype=np.float32) * 0.01
        return lambda: moe_cpu.pack_fp8(codes, s)
    bits = (rng.integers(0, 1 << 16, shape, dtype=np.uint16) & np.uint16(0x83FF)) | np.uint16(0x3C00)
    return lambda: moe_cpu.pack_bf16(bits)


def random_packed(rng, scheme, E, N, K):
    """Packed weights from random codes."""
    return random_codes(rng, scheme, E, N, K)()


def timed(fn, min_time=0.4, max_calls=30):
    fn()
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Routing:
    """Token -> expert ids. M=1 walks a permutation so an expert returns only every E/k calls."""

    def __init__(self, rng, E, k):
        self.rng, self.E, self.k, self.pos = rng, E, k, 0
        self.perm = rng.permutation(E)

    def next(self, M):
        if M == 1:
            if self.pos + self.k > self.E:
                self.perm, self.pos = self.rng.permutation(self.E), 0
            ids = self.perm[self.pos:self.pos + self.k][None, :]
            self.pos += self.k
        else:
            ids = np.argsort(self.rng.random((M, self.E)), axis=1)[:, :self.k]
        return np.ascontiguousarray(ids, dtype=np.int32)


def weight_bytes(w13, w2, ids):
    used = len(np.unique(ids))
    return used * (w13.nbytes + w2.nbytes) / w13.num_experts


# The instruction each kernel's inner loop is made of, by (precision word, ISA word) of its name: a
# scheme's %peak is taken against the register-only peak of that instruction (chain). Kernels with
# no entry (the Eigen reference, Arm) have no SIMD peak here.
PEAK_INSN = {
    ("w4a8", "avx512vnni"): "vpdpbusd_zmm", ("w8a8", "avx512vnni"): "vpdpbusd_zmm",
    ("fp8w", "avx512vbmi"): "vdpbf16ps_zmm", ("fp8w", "avx512bf16"): "vdpbf16ps_zmm", ("bf16", "avx512bf16"): "vdpbf16ps_zmm",
    ("w4a8", "avx2vnni"): "vpdpbusd_ymm", ("w8a8", "avx2vnni"): "vpdpbusd_ymm",
    ("w4a8", "avx2"): "maddubs_ymm", ("w8a8", "avx2"): "maddubs_ymm", ("fp8w", "avx2"): "fma_ymm", ("bf16", "avx2"): "fma_ymm",
}


def peak_insn(kernel: str):
    """'w8a8_avx2_4x16' -> 'maddubs_ymm'; None for kernels without a measured peak."""
    parts = kernel.split("_")
    return PEAK_INSN.get((parts[0], parts[1])) if len(parts) > 1 else None


def tier() -> str:
    """The ISA tier the kernels chosen now belong to: their ISA words, best first ('avx2', 'reference')."""
    isas = []
    for k in moe_cpu.cpu_features()["kernels"].values():
        isa = k.split("_")[1]
        if isa not in isas:
            isas.append(isa)
    return " + ".join(isas)


class Peaks:
    """Instruction peaks of this run, measured once on first use (TOPS: tera int8 ops or flops per s)."""

    def __init__(self, threads):
        self.threads, self.tops = threads, {}
        self.what = {p["name"]: p["what"] for p in _core.peak_instructions()}

    def of(self, kernel):
        insn = peak_insn(kernel)
        if insn is not None and insn not in self.tops:
            self.tops[insn] = _core.instruction_peak_tops(insn, self.threads)
        return insn, (self.tops[insn] if insn else None)


def run(args):
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
        if k > E:
            raise ValueError(f"--experts {E} is below the {shape} top-k of {k}")
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
            print(f"{'M':>5} {'ms/call':>9} {'tok/s':>9} {'GB/s':>7} {'%bw':>5} {'GOPS':>8} {'%peak':>6}")
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
                      f"{pct}{extra}")
            del w13, w2
    return limits, rows


def numpy_peer(x, w13f, w2f, tw, ids):
    """The NumPy float32 layer: per-expert matmuls on dequantized weights (the peer run in-process)."""
    I = w2f.shape[2]
    out = np.zeros((x.shape[0], w2f.shape[1]), np.float32)
    for e in np.unique(ids):
        rows, cols = np.nonzero(ids == e)
        y = x[rows] @ w13f[e].T
        with np.errstate(over="ignore"):  # random weights: exp(-g) may overflow to inf, silu -> 0
            h = y[:, :I] / (1 + np.exp(-y[:, :I])) * y[:, I:]
        np.add.at(out, rows, (h @ w2f[e].T) * tw[rows, cols][:, None])
    return out


def peers(args, rng):
    """Qwen3 shape: the dispatched kernel against the Eigen reference path and NumPy float32."""
    H, I, _, k, E, _ = SHAPES["qwen3-30b-a3b"]
    rows = []
    print("\npeers (qwen3-30b-a3b shape): ms per call")
    print(f"{'scheme':<10} {'M':>5} {'simd':>9} {'reference':>10} {'numpy f32':>10} {'x ref':>7} {'x numpy':>8}")
    for scheme in args.schemes:
        w13, w2 = random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
        moe_cpu.force_isa("reference")
        r13, r2 = random_packed(np.random.default_rng(1), scheme, E, 2 * I, H), random_packed(np.random.default_rng(1), scheme, E, H, I)
        moe_cpu.force_isa(os.environ.get("MOE_CPU_ISA") or "native")
        f13, f2 = w13.unpack(), w2.unpack()
        for M in (1, 64):
            x = rng.standard_normal((M, H), dtype=np.float32)
            tw = np.full((M, k), 1.0 / k, np.float32)
            ids = np.ascontiguousarray(np.argsort(rng.random((M, E)), axis=1)[:, :k], dtype=np.int32)
            t_simd = timed(lambda: moe_cpu.fused_experts(x, w13, w2, tw, ids), 0.3)
            t_ref = timed(lambda: moe_cpu.fused_experts(x, r13, r2, tw, ids), 0.3, 3)
            t_np = timed(lambda: numpy_peer(x, f13, f2, tw, ids), 0.3, 5)
            rows.append(dict(scheme=scheme, M=M, simd_ms=t_simd * 1e3, reference_ms=t_ref * 1e3, numpy_ms=t_np * 1e3,
                             kernel=w13.kernel, reference_kernel=r13.kernel))
            print(f"{scheme:<10} {M:>5} {t_simd * 1e3:>9.2f} {t_ref * 1e3:>10.2f} {t_np * 1e3:>10.2f} "
                  f"{t_ref / t_simd:>7.1f} {t_np / t_simd:>8.1f}")
        del w13, w2, r13, r2, f13, f2
    return rows


def torch_peer(rng, threads, ms=(1, 1024)):
    """Qwen3 shape, bf16 scheme against torch on the CPU: a vLLM-style loop over the experts (gather
    the expert's rows, linear, SiLU and mul, linear, router weight, index_add) on the same weights as
    fp32 and as bf16 tensors. Runs where torch is installed."""
    # torch held to the same tier as a forced ISA level (its own variables, unless set; they are
    # read when torch is imported, so not when it already was).
    level = moe_cpu.cpu_features()["isa"]
    held = {"avx2": ("avx2", "AVX2"), "avx2vnni": ("avx2", "AVX2_VNNI"), "reference": ("default", "SSE41")}.get(level)
    held = None if "torch" in sys.modules else held
    if held:
        os.environ.setdefault("ATEN_CPU_CAPABILITY", held[0])
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", held[1])
    try:
        import torch
    except ImportError:
        print("\ntorch peer: torch is not installed (pip install torch==2.13.0 takes the CPU wheel)")
        return []
    torch.set_num_threads(threads)
    H, I, _, k, E, _ = SHAPES["qwen3-30b-a3b"]
    w13, w2 = random_packed(rng, "bf16", E, 2 * I, H), random_packed(rng, "bf16", E, H, I)
    t13, t2 = torch.from_numpy(w13.unpack()), torch.from_numpy(w2.unpack())
    weights = {"fp32": (t13, t2), "bf16": (t13.to(torch.bfloat16), t2.to(torch.bfloat16))}
    F = torch.nn.functional

    def loop(x, ids, tw, a13, a2):
        out = torch.zeros(x.shape[0], H, dtype=x.dtype)
        for e in torch.unique(ids).tolist():
            rows, cols = torch.nonzero(ids == e, as_tuple=True)
            y = F.linear(x[rows], a13[e])
            out.index_add_(0, rows, F.linear(F.silu(y[:, :I]) * y[:, I:], a2[e]) * tw[rows, cols, None])
        return out

    print(f"\ntorch {torch.__version__} peer (qwen3-30b-a3b shape, vLLM-style loop over experts, {threads} threads): "
          "ms per call (GFLOPS)" + (f"; torch held to ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']}, "
                                     f"ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']}" if held else ""))
    print(f"{'M':>5} {'moe_cpu bf16':>20} {'torch fp32 weights':>20} {'torch bf16 weights':>20} {'x fp32':>7} {'x bf16':>7}")
    rows = []
    with torch.inference_mode():
        for M in ms:
            x = rng.standard_normal((M, H), dtype=np.float32)
            tw = np.full((M, k), 1.0 / k, np.float32)
            ids = np.ascontiguousarray(np.argsort(rng.random((M, E)), axis=1)[:, :k], dtype=np.int32)
            ops = 2.0 * M * k * 3 * H * I
            t_ours = timed(lambda: moe_cpu.fused_experts(x, w13, w2, tw, ids), 0.5)
            r = dict(M=M, kernel=w13.kernel, moe_cpu_ms=t_ours * 1e3, moe_cpu_gflops=ops / t_ours / 1e9,
                     torch_version=torch.__version__, torch_held_to=held)
            for name, (a13, a2) in weights.items():
                dt = a13.dtype
                xt, twt, idt = torch.from_numpy(x).to(dt), torch.from_numpy(tw).to(dt), torch.from_numpy(ids).long()
                t = timed(lambda: loop(xt, idt, twt, a13, a2), 0.5, 10)
                r[f"torch_{name}_ms"], r[f"torch_{name}_gflops"] = t * 1e3, ops / t / 1e9
            rows.append(r)
            cell = lambda n: f"{r[n + '_ms']:>9.2f} ({r[n + '_gflops']:>6.1f})"
            print(f"{M:>5} {cell('moe_cpu'):>20} {cell('torch_fp32'):>20} {cell('torch_bf16'):>20} "
                  f"{r['torch_fp32_ms'] / r['moe_cpu_ms']:>7.1f} {r['torch_bf16_ms'] / r['moe_cpu_ms']:>7.1f}")
    return rows


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


def main(argv=None) -> int:
    """Run the benchmark (``moe-cpu bench``); returns the exit status."""
    p = argparse.ArgumentParser(prog="moe-cpu bench", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", type=_csv(list(SHAPES), "--shapes"), default=list(SHAPES))
    p.add_argument("--schemes", type=_csv(list(moe_cpu.SCHEMES) + list(FORMS), "--schemes"), default=list(moe_cpu.SCHEMES),
                   help="schemes, and checkpoint forms: " + ", ".join(FORMS))
    p.add_argument("--gguf", action="store_true", help="the GGUF form rows: " + ",".join(GGUF_ROWS))
    p.add_argument("--m", type=_m_list, default=list(MS), help="token counts, e.g. 1,16,256")
    p.add_argument("--experts", type=int, default=0, help="use this many experts for every shape (0: the table's)")
    p.add_argument("--quick", action="store_true", help="Qwen3 shape, M = 1, 16, 256")
    p.add_argument("--no-peers", action="store_true", help="skip the reference / NumPy / torch comparisons")
    p.add_argument("--torch-peer-only", action="store_true",
                   help="of the comparisons, only torch's (bf16 scheme; where torch is installed)")
    p.add_argument("--out", default="bench_out", help="output directory (default ./bench_out)")
    a = p.parse_args(argv)
    if a.quick:
        a.shapes, a.m = ["qwen3-30b-a3b"], [1, 16, 256]
    if a.gguf:
        a.schemes = GGUF_ROWS
    a.ms = tuple(a.m)
    try:
        limits, rows = run(a)
        peer_rows = [] if a.no_peers or a.torch_peer_only else peers(a, np.random.default_rng(2))
        torch_rows = [] if a.no_peers else torch_peer(np.random.default_rng(3), limits["threads"])
    except ValueError as e:
        print(f"moe-cpu bench: error: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench_moe.json"), "w") as f:
        json.dump({"limits": limits, "features": moe_cpu.cpu_features(), "rows": rows, "peers": peer_rows,
                   "torch_peer": torch_rows}, f, indent=1)
    try:
        plot(rows, os.path.join(a.out, "bench_moe.png"))
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'moe_cpu[bench]')")
    print(f"wrote {os.path.join(a.out, 'bench_moe.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
