"""The ``moe-cpu`` command line (also ``python -m moe_cpu``).

    moe-cpu info                      CPU features, the kernel of each scheme, threads, version
    moe-cpu bench [--experts 128] [--tokens 1,16,256] [--schemes int8_w8a8,bf16] [--out FILE]
    moe-cpu demo [demo args]          the Qwen3-30B-A3B-shaped accuracy / speed demo
    moe-cpu convert --checkpoint PATH --out DIR --layers 1,3-5 [--scheme S]
                                      packed layer directories (MoELayer.save) for fast loading
    moe-cpu run --checkpoint PATH --layer L [--tokens 32] [--scheme S]
                                      random tokens through one layer: error vs float64, speed
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from . import _core, api


# ------------------------------------------------------------------------------------------ info
def cmd_info(args: argparse.Namespace) -> int:
    """Print what this build and this CPU give: features, ISA level, kernels, threads, version."""
    from . import __version__

    f = api.cpu_features()
    print(f"moe_cpu {__version__}")
    print(f"threads:           {api.get_num_threads()}")
    print(f"ISA level:         {f['isa']}")
    print(f"detected features: {' '.join(f['detected']) or '(none)'}")
    print(f"active features:   {' '.join(f['active']) or '(none)'}")
    print("kernel per scheme:")
    for scheme, kernel in f["kernels"].items():
        print(f"  {scheme:<10} {kernel}")
    print("registered kernels:")
    print(f"  {'name':<24} {'scheme':<10} {'isa':<12} tile")
    for k in _core.registered_kernels():
        print(f"  {k['name']:<24} {k['scheme']:<10} {k['isa']:<12} {k['mr']}x{k['nr']}")
    return 0


# ----------------------------------------------------------------------------------------- bench
def random_packed(rng: np.random.Generator, scheme: str, E: int, N: int, K: int) -> api.PackedExperts:
    """Packed weights from random codes (values do not matter for speed; no float32 copy)."""
    shape = (E, N, K)
    if scheme == "int4_w4a8":
        g = 128 if K % 128 == 0 else 32 if K % 32 == 0 else -1
        G = 1 if g == -1 else K // g
        return api.pack_int4(rng.integers(-8, 8, shape, dtype=np.int8),
                             rng.random((E, N, G), dtype=np.float32) * 0.01, g)
    if scheme == "int8_w8a8":
        return api.pack_int8(rng.integers(-127, 128, shape, dtype=np.int8),
                             rng.random((E, N), dtype=np.float32) * 0.01)
    if scheme == "fp8_w8a16":   # finite e4m3 codes with random signs
        codes = rng.integers(0, 0x7E, shape, dtype=np.uint8) | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)
        return api.pack_fp8(codes, rng.random((E, -(-N // 128), -(-K // 128)), dtype=np.float32) * 0.01)
    # bf16: exponent near 1.0, random sign and mantissa
    bits = (rng.integers(0, 1 << 16, shape, dtype=np.uint16) & np.uint16(0x83FF)) | np.uint16(0x3C00)
    return api.pack_bf16(bits)


def _median_time(fn, min_time: float, max_calls: int = 50) -> float:
    fn()   # warm up
    times: List[float] = []
    end = time.perf_counter() + min_time
    while len(times) < 3 or (time.perf_counter() < end and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _int_list(s: str) -> List[int]:
    try:
        vals = [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def _schemes(s: str) -> List[str]:
    vals = [v.strip() for v in s.split(",") if v.strip()]
    bad = [v for v in vals if v not in api.SCHEMES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"unknown scheme(s) {bad or s!r}; choose from {','.join(api.SCHEMES)}")
    return vals


def cmd_bench(args: argparse.Namespace) -> int:
    """Time fused_experts on random packed weights for each scheme and token count; write JSON."""
    H, I, E, k = args.hidden, args.inter, args.experts, args.topk
    if not 1 <= k <= E:
        print(f"error: --topk {k} must be in [1, --experts {E}]", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    from . import __version__

    print(f"moe_cpu {__version__} bench: H={H} I={I} E={E} k={k}, {api.get_num_threads()} threads, "
          f"ISA level '{api.cpu_features()['isa']}'")
    rows = []
    for scheme in args.schemes:
        w13, w2 = random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
        per_expert = (w13.nbytes + w2.nbytes) / E
        print(f"\n{scheme}: kernel {w13.kernel}, {(w13.nbytes + w2.nbytes) / 2**20:.1f} MiB")
        print(f"{'M':>6} {'ms/call':>9} {'tokens/s':>10} {'weight GB/s':>12}")
        for M in args.tokens:
            x = rng.standard_normal((M, H), dtype=np.float32)
            tw = np.full((M, k), 1.0 / k, np.float32)
            # several routings, cycled, so that M=1 does not reuse the same experts every call
            routes = [np.ascontiguousarray(np.argsort(rng.random((M, E)), axis=1)[:, :k], dtype=np.int32)
                      for _ in range(8)]
            i = [0]

            def call() -> None:
                api.fused_experts(x, w13, w2, tw, routes[i[0] % len(routes)])
                i[0] += 1

            t = _median_time(call, args.min_time)
            used = float(np.mean([len(np.unique(r)) for r in routes]))
            row = dict(scheme=scheme, kernel=w13.kernel, M=M, ms=t * 1e3, tokens_per_s=M / t,
                       weight_gbs=used * per_expert / t / 1e9)
            rows.append(row)
            print(f"{M:>6} {row['ms']:>9.3f} {row['tokens_per_s']:>10.0f} {row['weight_gbs']:>12.1f}")
        del w13, w2
    result = dict(moe_cpu_version=__version__, threads=api.get_num_threads(), cpu=api.cpu_features(),
                  shape=dict(H=H, I=I, E=E, k=k), rows=rows)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nwrote {args.out}")
    return 0


# ------------------------------------------------------------------------------- convert / run
def _layer_list(s: str) -> List[int]:
    """'1,3-5' -> [1, 3, 4, 5]."""
    out: List[int] = []
    try:
        for part in s.split(","):
            a, _, b = part.partition("-")
            out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer numbers like 1,3-5, got {s!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative layer numbers, got {s!r}")
    return out


def _open_layer(path: str, layer: int, scheme: Optional[str]):
    """A converted layer directory (layer.json) or layer `layer` of a checkpoint."""
    from .layer import MoELayer

    if os.path.isfile(os.path.join(path, "layer.json")):
        return MoELayer.load(path)
    return MoELayer.from_pretrained(path, layer, scheme)


def cmd_convert(args: argparse.Namespace) -> int:
    """Pack the MoE layers of a checkpoint once; each lands in OUT/layer_NNN (MoELayer.load maps it)."""
    from .layer import MoELayer

    try:
        from tqdm import tqdm
    except ImportError:   # the progress bar is cosmetic: say so and go on without it
        print("(install tqdm for a progress bar)", file=sys.stderr)

        def tqdm(it, **_):  # type: ignore[no-redef]
            return it

    for layer in tqdm(args.layers, desc="converting", unit="layer"):
        m = MoELayer.from_pretrained(args.checkpoint, layer, args.scheme)
        m.save(os.path.join(args.out, f"layer_{layer:03d}"))
    print(f"wrote {len(args.layers)} layer(s) to {args.out}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Random tokens through one layer: relative L2 error against the float64 layer with the same
    (dequantized) weights, and the time per call."""
    m = _open_layer(args.checkpoint, args.layer, args.scheme)
    print(m)
    x = np.random.default_rng(args.seed).standard_normal((args.tokens, m.hidden_size), dtype=np.float32)
    out = m(x)
    ref = m.reference(x)
    err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
    t = _median_time(lambda: m(x), args.min_time)
    print(f"{args.tokens} tokens: relative L2 error vs float64 {err:.4g}, {t * 1e3:.3f} ms/call, "
          f"{args.tokens / t:.0f} tokens/s")
    return 0


# ------------------------------------------------------------------------------------------ main
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moe-cpu", description="moe_cpu: CPU Mixture-of-Experts kernels.")
    sub = p.add_subparsers(dest="command", metavar="{info,bench,demo,convert,run}")
    sub.required = True
    sub.add_parser("info", help="CPU features, kernel per scheme, threads, version")
    b = sub.add_parser("bench", help="quick fused_experts benchmark (Qwen3-30B-A3B shape by default)")
    b.add_argument("--experts", type=int, default=128, help="number of experts E (default 128)")
    b.add_argument("--hidden", type=int, default=2048, help="hidden size H (default 2048)")
    b.add_argument("--inter", type=int, default=768, help="expert intermediate size I (default 768)")
    b.add_argument("--topk", type=int, default=8, help="experts per token k (default 8)")
    b.add_argument("--tokens", type=_int_list, default=[1, 16, 256], help="token counts M, e.g. 1,16,256")
    b.add_argument("--schemes", type=_schemes, default=list(api.SCHEMES),
                   help=f"comma-separated, default {','.join(api.SCHEMES)}")
    b.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per point")
    b.add_argument("--out", default="moe_cpu_bench.json", help="JSON output (default ./moe_cpu_bench.json)")
    sub.add_parser("demo", help="Qwen3-30B-A3B-shaped demo; other arguments go to moe_cpu.demo",
                   add_help=False)
    c = sub.add_parser("convert", help="pack checkpoint layers once into directories that load by mmap")
    c.add_argument("--checkpoint", required=True, help="safetensors directory / file or .gguf file")
    c.add_argument("--out", required=True, help="output directory (one layer_NNN directory per layer)")
    c.add_argument("--layers", required=True, type=_layer_list, help="layer numbers, e.g. 1,3-5")
    c.add_argument("--scheme", default=None, help="scheme for unquantized checkpoints (default: as stored / bf16)")
    r = sub.add_parser("run", help="random tokens through one layer: accuracy vs float64 and speed")
    r.add_argument("--checkpoint", required=True, help="checkpoint, or a directory written by convert")
    r.add_argument("--layer", type=int, default=0, help="layer number in the checkpoint")
    r.add_argument("--tokens", type=int, default=32, help="number of random tokens (default 32)")
    r.add_argument("--scheme", default=None, help="scheme for unquantized checkpoints")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``moe-cpu``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":   # everything after 'demo' belongs to the demo's own parser
        from . import demo
        demo.main(argv[1:])
        return 0
    args = _parser().parse_args(argv)
    try:
        return {"info": cmd_info, "bench": cmd_bench, "convert": cmd_convert, "run": cmd_run}[args.command](args)
    except (ValueError, TypeError) as e:   # bad checkpoint, arguments or files: the message says what
        print(f"moe-cpu {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:   # e.g. `moe-cpu info | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
