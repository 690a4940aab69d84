"""The ``moe-cpu`` command line (also ``python -m moe_cpu``).

    moe-cpu info                      CPU features, the kernel of each scheme, threads, version
    moe-cpu bench [--quick] [--shapes ...] [--m 1,16] [--schemes ...] [--experts E] [--out DIR]
    moe-cpu demo [demo args]          the Qwen3-30B-A3B-shaped accuracy / speed demo
    moe-cpu convert --checkpoint PATH --out DIR --layers 1,3-5 [--scheme S]
                                      packed layer directories (MoELayer.save) for fast loading
    moe-cpu run --checkpoint PATH --layer L [--tokens 32] [--scheme S]
                                      random tokens through one layer: error vs float64, speed
    mpirun -np N moe-cpu run --ep ... / mpirun -np N moe-cpu bench --ep [--shapes ...] [--m 1,512]
                                      expert parallel over MPI (moe_cpu.distributed)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from . import _core, api
from ._argtypes import at_least

SCHEMES = api.SCHEMES
SCHEME_HELP = ("unquantized checkpoints: the scheme to quantize to (default bf16); int checkpoints: the activations, "
               "e.g. int4_w4a8 (int8, faster prefill) or int4_w4a16 (16-bit; the default for GPTQ / AWQ / "
               "compressed-tensors W4A16 / MXFP4; GGUF defaults to A8); default: what the checkpoint means")


# ------------------------------------------------------------------------------------------ info
def cmd_info(args: argparse.Namespace) -> int:
    """Print what this build and this CPU give: features, ISA level, kernels, threads, version."""
    from . import __version__
    from .bench.peaks import peak_insn, tier

    f = api.cpu_features()
    print(f"moe_cpu {__version__}")
    print(f"threads:           {api.get_num_threads()}")
    print(f"ISA level:         {f['isa']}")
    print(f"tier:              {tier()}")
    print(f"detected features: {' '.join(f['detected']) or '(none)'}")
    print(f"active features:   {' '.join(f['active']) or '(none)'}")
    every = f["amx_min_rows_set"] and f["amx_min_rows"] == 1
    forms = "" if f["amx_min_rows_set"] else f"; bf16 and fp8 from {f['amx_min_rows_float']}"
    forms += "; every form" if every else "; A16 and int4 / int8 groups of 32 stay on AVX-512"
    print(f"AMX:               {f['amx']} (tiles for experts with >= {f['amx_min_rows']} rows{forms})")
    print("kernel per scheme (and the instruction its bench %peak is taken against):")
    what = {p["name"]: p["what"] for p in _core.peak_instructions()}
    for scheme, kernel in f["kernels"].items():
        insn = peak_insn(kernel)
        print(f"  {scheme:<10} {kernel:<24} {what[insn] if insn else 'no SIMD peak'}")
    print("A8 activation blocks (int4_w4a8 / int8_w8a8; act_block=, --act-block): one int8 scale per token, or per "
          f"{', '.join(map(str, api.ACT_BLOCKS))} channels; GGUF loads with blocks of 32 (ggml's Q8_0, finer than Q8_K), 128 for the K-quants, "
          "compressed-tensors per token. Every kernel above takes them.")
    print("registered kernels:")
    print(f"  {'name':<24} {'scheme':<10} {'isa':<12} tile")
    for k in _core.registered_kernels():
        print(f"  {k['name']:<24} {k['scheme']:<10} {k['isa']:<12} {k['mr']}x{k['nr']}")
    return 0


# ----------------------------------------------------------------------------------------- bench
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


def _act_block(v: str) -> object:
    """--act-block: auto, none, or one of 32, 64, 128, 256."""
    if v in ("auto", "none"):
        return None if v == "none" else "auto"
    if v.isdigit() and int(v) in (32, 64, 128, 256):
        return int(v)
    raise argparse.ArgumentTypeError(f"{v!r} is not auto, none, 32, 64, 128 or 256")


ACT_BLOCK_HELP = ("A8 activation blocks: auto (default: what the file means; GGUF blocks of 32, 128 for the K-quants), none "
                  "(one scale per token), or 32, 64, 128, 256 channels per int8 scale")


def _open_layer(path: str, layer: Optional[int], scheme: Optional[str], act_block: object = "auto"):
    """A converted layer directory (layer.json) or layer `layer` (default 0) of a checkpoint."""
    from .layer import MoELayer

    if os.path.isfile(os.path.join(path, "layer.json")):
        if layer is not None or scheme is not None:   # the same command line serves both sources: say so
            print(f"({path} is a converted layer, one layer already packed: --layer / --scheme are not used)",
                  file=sys.stderr)
        return MoELayer.load(path)
    return MoELayer.from_pretrained(path, 0 if layer is None else layer, scheme, act_block=act_block)


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
        m = MoELayer.from_pretrained(args.checkpoint, layer, args.scheme, act_block=args.act_block)
        m.save(os.path.join(args.out, f"layer_{layer:03d}"))
    print(f"wrote {len(args.layers)} layer(s) to {args.out}")
    return 0


def cmd_run_ep(args: argparse.Namespace) -> int:
    """``mpirun -np N moe-cpu run --ep``: the layer split over the ranks (each reads only its
    experts); error against the float64 layer and time per call, printed by rank 0."""
    from .distributed import EPMoELayer
    from .distributed._mpi import mpi
    from .layer import MoELayer

    comm = mpi().COMM_WORLD
    if os.path.isfile(os.path.join(args.checkpoint, "layer.json")):   # converted: mapped, then split
        m = EPMoELayer.from_layer(_open_layer(args.checkpoint, args.layer, args.scheme, args.act_block), comm,
                                  exact=args.exact)
    else:
        m = EPMoELayer.from_pretrained(args.checkpoint, 0 if args.layer is None else args.layer, args.scheme,
                                       comm=comm, exact=args.exact, act_block=args.act_block)
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    for line in comm.allgather(repr(m)):
        say(line)
    x = np.random.default_rng(args.seed).standard_normal((args.tokens, m.hidden_size), dtype=np.float32)
    out, ref = m(x), m.reference(x)
    err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
    times = []
    for _ in range(args.calls):   # a fixed count: every rank makes the same calls
        comm.Barrier()
        t0 = time.perf_counter()
        m(x)
        times.append(time.perf_counter() - t0)
    t = max(comm.allgather(sorted(times)[len(times) // 2]))
    say(f"{args.tokens} tokens on {comm.Get_size()} ranks: relative L2 error vs float64 {err:.4g}, "
        f"{t * 1e3:.3f} ms/call, {args.tokens / t:.0f} tokens/s")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Random tokens through one layer: relative L2 error against the float64 layer with the same
    (dequantized) weights, and the time per call."""
    if args.ep:
        return cmd_run_ep(args)
    m = _open_layer(args.checkpoint, args.layer, args.scheme, args.act_block)
    print(m)
    x = np.random.default_rng(args.seed).standard_normal((args.tokens, m.hidden_size), dtype=np.float32)
    out = m(x)
    ref = m.reference(x)
    err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
    from .bench.timing import timed

    t = timed(lambda: m(x), args.min_time)
    print(f"{args.tokens} tokens: relative L2 error vs float64 {err:.4g}, {t * 1e3:.3f} ms/call, "
          f"{args.tokens / t:.0f} tokens/s")
    return 0


# ------------------------------------------------------------------------------------------ main
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moe-cpu", description="moe_cpu: CPU Mixture-of-Experts kernels.")
    sub = p.add_subparsers(dest="command", metavar="{info,bench,demo,convert,run}")
    sub.required = True
    sub.add_parser("info", help="CPU features, kernel per scheme, threads, version")
    sub.add_parser("bench", help="model-shape benchmark with machine limits (moe_cpu.bench; --help there)",
                   add_help=False)
    sub.add_parser("demo", help="Qwen3-30B-A3B-shaped demo; other arguments go to moe_cpu.demo",
                   add_help=False)
    c = sub.add_parser("convert", help="pack checkpoint layers once into directories that load by mmap")
    c.add_argument("--checkpoint", required=True, help="safetensors directory / file or .gguf file")
    c.add_argument("--out", required=True, help="output directory (one layer_NNN directory per layer)")
    c.add_argument("--layers", required=True, type=_layer_list, help="layer numbers, e.g. 1,3-5")
    c.add_argument("--scheme", default=None, choices=SCHEMES, help=SCHEME_HELP)
    c.add_argument("--act-block", type=_act_block, default="auto", help=ACT_BLOCK_HELP)
    r = sub.add_parser("run", help="random tokens through one layer: accuracy vs float64 and speed")
    r.add_argument("--checkpoint", required=True, help="checkpoint, or a directory written by convert")
    r.add_argument("--layer", type=at_least(0, int, "a layer number"), default=None,
                   help="layer number in the checkpoint (default 0; a converted layer has one)")
    r.add_argument("--tokens", type=at_least(1, int, "a token count"), default=32,
                   help="number of random tokens (default 32)")
    r.add_argument("--scheme", default=None, choices=SCHEMES, help=SCHEME_HELP)
    r.add_argument("--act-block", type=_act_block, default="auto", help=ACT_BLOCK_HELP)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--min-time", type=at_least(0, float, "seconds"), default=0.3, help="seconds of timed calls")
    r.add_argument("--ep", action="store_true", help="expert parallel over MPI: mpirun -np N moe-cpu run --ep ...")
    r.add_argument("--exact", action="store_true", help="with --ep: bit-identical to one process (k x the traffic)")
    r.add_argument("--calls", type=at_least(1, int, "a call count"), default=10,
                   help="with --ep: timed calls (the same on every rank)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``moe-cpu``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":   # everything after 'demo' belongs to the demo's own parser
        from . import demo
        return demo.main(argv[1:])
    if argv and argv[0] == "bench":  # likewise for the benchmark
        if "--ep" in argv:           # expert parallel, under mpirun
            from .distributed import bench as ep_bench
            return ep_bench.main([a for a in argv[1:] if a != "--ep"])
        from .bench.main import main as bench_main
        return bench_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return {"info": cmd_info, "convert": cmd_convert, "run": cmd_run}[args.command](args)
    except (ValueError, TypeError) as e:   # bad checkpoint, arguments or files: the message says what
        print(f"moe-cpu {args.command}: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:   # e.g. --tokens far beyond this machine
        print(f"moe-cpu {args.command}: error: not enough memory ({e})", file=sys.stderr)
        return 2
    except BrokenPipeError:   # e.g. `moe-cpu info | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
