"""Instruction mix of each kernel's innermost loop, from a build's disassembly: dot / FMA against other instructions.

For every kernel object file of a CMake build it finds the main register tile's function, takes the
innermost loop (a backward branch) that holds the dot-product instructions, and counts what is in
it. Used by docs/performance.md to explain speed figures. Needs a CMake build directory (scripts/setup.sh makes
build/py) and binutils' objdump (aarch64-linux-gnu-objdump for the Arm kernels).

    python bench/studies/inner_loop_mix.py build/py           # a CMake build directory (x86-64; the default)
    python bench/studies/inner_loop_mix.py build/arm          # the AArch64 cross build (aarch64-linux-gnu-objdump)
    python bench/studies/inner_loop_mix.py --kernels w4a8_avx2                         # a quick check
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import re
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]

DOT = ("vpdpbusd", "vdpbf16ps", "vpmaddubsw", "vfmadd231ps", "vfmadd213ps", "vfmadd132ps", "sdot", "fmla", "bfdot",
       "smmla", "bfmmla")
TILES = {  # kernel file -> the tile template (its ::run) or function that does the work at M >= 64
    "w4a8_avx512vnni": "Micro<6, 2>", "w8a8_avx512vnni": "Micro<6, 4>",
    "bf16_avx512bf16": "Micro<4, 4>", "fp8w_avx512bf16": "Micro<8, 1>", "fp8w_avx512vbmi": "Micro<8, 1>",
    "w4a8_avx2vnni": "Micro<4, 1>", "w8a8_avx2vnni": "Micro<4, 1>",
    "w4a8_avx2": "Micro<4, 1>", "w8a8_avx2": "Micro<4, 1>",
    "bf16_avx2": "FloatAvx2<false>::tiled", "fp8w_avx2": "FloatAvx2<true>::tiled",
    "w4a8_neon_dotprod": "Micro<4, 1>", "w8a8_neon_dotprod": "Micro<4, 1>", "bf16_neon": "Micro<4, 1>",
    "fp8w_neon": "Micro<2, 1>", "bf16_neon_bf16": "Micro<4, 1>", "fp8w_neon_bf16": "Micro<4, 1>",
    "w4a8_neon_i8mm": "Micro<4, 1>", "w8a8_neon_i8mm": "Micro<4, 1>",
}


def _is_branch(op: str) -> bool:
    return op.startswith("j") or op.startswith("b.") or op in ("b", "cbnz", "cbz", "tbnz", "tbz")


def loop_mix(obj: pathlib.Path, tile: str, objdump: str = "objdump"):
    asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", str(obj)], capture_output=True, text=True).stdout
    funcs = re.split(r"\n(?=[0-9a-f]+ <)", asm)
    body = next((f for f in funcs if f"::{tile}::run" in f.splitlines()[0] or f"::{tile}(" in f.splitlines()[0]), None)
    if body is None:
        return None
    ins = []
    for line in body.splitlines()[1:]:
        m = re.match(r"\s*([0-9a-f]+):\s+(?:\{vex\}\s+)?(\S+)\s*(.*)", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    loops = []   # (start index, end index) of every backward branch
    for i, (addr, op, args) in enumerate(ins):
        t = re.search(r"\b([0-9a-f]+) <", args)
        if _is_branch(op) and t and int(t.group(1), 16) < addr:
            loops.append((next(j for j, x in enumerate(ins) if x[0] >= int(t.group(1), 16)), i))
    inner = [(s0, e0) for s0, e0 in loops if not any(s0 <= s1 and e1 < e0 for s1, e1 in loops if (s1, e1) != (s0, e0))]
    fma = ("fmla", "vfmadd231ps", "vfmadd213ps", "vfmadd132ps")  # also in scale epilogues: rank dot products first
    best = max((ins[s0:e0 + 1] for s0, e0 in inner),
               key=lambda lp: (sum(x[1] in DOT and x[1] not in fma for x in lp), sum(x[1] in DOT for x in lp), -len(lp)),
               default=None)
    if best is not None and not any(x[1] in DOT for x in best):
        best = None
    return collections.Counter(x[1] for x in best) if best else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?", default=str(ROOT / "build" / "py"),
                    help="a CMake build directory (default: the repository's build/py)")
    ap.add_argument("--kernels", default=",".join(TILES), help="kernel files, comma-separated (default: all)")
    a = ap.parse_args(argv)
    kernels = a.kernels.split(",")
    bad = [k for k in kernels if k not in TILES]
    if bad:
        ap.error(f"--kernels: unknown {bad[0]!r}; choose from {', '.join(TILES)}")
    build = pathlib.Path(a.build)
    if not build.is_dir():
        ap.error(f"no build directory {build} (scripts/setup.sh builds build/py)")
    found = {name: objs[0] for name in kernels for objs in [sorted(build.rglob(f"{name}.cpp.o"))] if objs}
    if not found:
        ap.error(f"no kernel object files ({', '.join(k + '.cpp.o' for k in kernels[:3])}, ...) under {build}")
    tools = {name: "aarch64-linux-gnu-objdump" if "neon" in name else "objdump" for name in found}
    missing = sorted({t for t in tools.values() if not shutil.which(t)})
    if missing:
        ap.error(f"needs {missing[0]} (binutils) for {', '.join(n for n, t in tools.items() if t == missing[0])}")
    for name, obj in found.items():
        tile = TILES[name]
        mix = loop_mix(obj, tile, tools[name])
        if mix is None:
            print(f"{name:<18} {tile}: loop not found")
            continue
        total = sum(mix.values())
        dots = sum(v for k, v in mix.items() if k in DOT)
        rest = ", ".join(f"{k} {v}" for k, v in mix.most_common())
        print(f"{name:<18} {tile:<24} {total:>3} instructions, {dots:>2} dot/FMA: {rest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
