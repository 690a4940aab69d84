"""Instruction mix of each kernel's innermost loop, read from the disassembly (objdump -d).

For every kernel object file of a CMake build it finds the main register tile's function, takes the
innermost loop (a backward branch) that holds the dot-product instructions, and counts what is in
it. Used by docs/performance.md to explain speed figures.

    python bench/inner_loop_mix.py build/ctest        # a CMake build directory
"""
from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys

DOT = ("vpdpbusd", "vdpbf16ps", "vpmaddubsw", "vfmadd231ps", "vfmadd213ps", "vfmadd132ps")
TILES = {  # kernel file -> the tile template that does the work at M >= 64
    "w4a8_avx512vnni": "Micro<3, 4>", "w8a8_avx512vnni": "Micro<3, 4>",
    "bf16_avx512bf16": "Micro<4, 4>", "fp8w_avx512bf16": "Micro<8, 1>",
    "w4a8_avx2": "Micro<4, 1>", "w8a8_avx2": "Micro<4, 1>", "bf16_avx2": "Micro<4, 1>", "fp8w_avx2": "Micro<4, 1>",
}


def loop_mix(obj: pathlib.Path, tile: str):
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(obj)], capture_output=True, text=True).stdout
    funcs = re.split(r"\n(?=[0-9a-f]+ <)", asm)
    body = next((f for f in funcs if f"::{tile}::run" in f.splitlines()[0]), None)
    if body is None:
        return None
    ins = []
    for line in body.splitlines()[1:]:
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    best = None
    for i, (addr, op, args) in enumerate(ins):  # backward jumps close loops
        t = re.match(r"([0-9a-f]+)", args)
        if op.startswith("j") and t and int(t.group(1), 16) < addr:
            start = next(j for j, x in enumerate(ins) if x[0] >= int(t.group(1), 16))
            loop = ins[start:i + 1]
            if any(x[1] in DOT for x in loop) and (best is None or len(loop) < len(best)):
                best = loop
    return collections.Counter(x[1] for x in best) if best else None


def main() -> None:
    build = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build/ctest")
    for name, tile in TILES.items():
        objs = list(build.rglob(f"{name}.cpp.o"))
        if not objs:
            continue
        mix = loop_mix(objs[0], tile)
        if mix is None:
            print(f"{name:<18} {tile}: loop not found")
            continue
        total = sum(mix.values())
        dots = sum(v for k, v in mix.items() if k in DOT)
        rest = ", ".join(f"{k} {v}" for k, v in mix.most_common())
        print(f"{name:<18} {tile:<12} {total:>3} instructions, {dots:>2} dot/FMA: {rest}")


if __name__ == "__main__":
    main()
