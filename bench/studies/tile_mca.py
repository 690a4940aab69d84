#!/usr/bin/env python3
"""Cycles per 256 products of moe_cpu's AVX2 GGUF row tiles under llvm-mca, against ik_llama.cpp's hot loops.

Noise-free figures for a noisy host: each loop's steady-state cycles per 256 products (one row, a group of 32
channels and 8 columns: 8 vpmaddubsw) on llvm-mca's Sapphire Rapids (Golden Cove cores, as the Emerald Rapids
hosts) and Zen 3 models (the AVX2-only host of issue 40).

- moe_cpu: kernels/int_avx2_g32.h's row tiles, 8 rows, compiled here as the library compiles them (-O3, the avx2
  ISA region); the group loop is the smallest backward-jump loop with 64 vpmaddubsw. The loop holds every path
  of its run-time branches (scale forms, mins), so a tile with branches counts a little high.
- runs (256-blocks): kernels/int_avx2_runs.h's row tile (Q4_K against ggml's 256-blocks, or per token:
  the integer scales inside vpmaddwd, an int32 sum per run), their group loop the same way (the per-run epilogue
  outside it is left out).
- ik (``--ik-lib``): loops of the ik-llama-cpp-python==0.1.5 wheel's libggml, found by perf (cpu-clock) as
  ik's hottest at M = 512 with rtr=1, fmoe=1 on bench/ik_peer.py's files, by start address (listed in IK_LOOPS;
  another build has other addresses, and the script refuses a library whose bytes differ).

    python3 bench/studies/tile_mca.py [--ik-lib /tmp/ikpeer/ik_llama_cpp_python.libs/libggml-0b5e5db1.so]
    python3 bench/studies/tile_mca.py --cpus znver3 --iterations 10                  # a quick check

Needs g++, objdump and an llvm-mca that knows both CPUs (LLVM 16 or later: apt-get install llvm-19). LLVM 14's
"alderlake" is its Skylake model (two load ports), which docs/performance.md used before.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODES = {"kPlain": 0, "kTable": 1, "kSigned": 2, "kQword": 3, "kQwordSigned": 4, "kQwordTable": 5}  # int_avx2.h's Codes
TERMS = {"0": 0, "kG32Zc": 1, "kG32Mins": 2}  # int_avx2_g32.h's kF
# type -> the IntAvx2G32<kInt4, C, kBlk, P, kF, kSum> row tile GGUF loads run (int_avx2_g32.h), 8 rows
OURS = {
    "Q4_0": ("true", "kQword", 1, 2, "kG32Zc", 1),
    "Q8_0": ("false", "kPlain", 1, 2, "0", 1),
    "Q4_K": ("true", "kQword", 1, 2, "kG32Mins", 1),
    "IQ4_XS": ("true", "kQwordSigned", 1, 2, "0", 1),
}
IK_SHA256 = "7fd4ead67548206a"  # first 16 hex digits of the wheel's libggml-0b5e5db1.so
# type -> (loop start, share of ik's perf samples at M = 512); the loop ends at the backward jump to its start
IK_LOOPS = {
    "Q4_0": [(0x17AF960, "")],
    "Q8_0": [(0x17C0777, "38%"), (0x17A94D9, "28%")],
    "Q4_K": [(0x1626A60, "30%"), (0x161BE10, "23%")],
    "IQ4_XS": [(0x1630978, "39%"), (0x1625540, "28%")],
}


def find_mca(given: Optional[str]) -> str:
    if given:
        if not shutil.which(given):
            sys.exit(f"--mca {given!r}: not found")
        return given
    for name in [f"llvm-mca-{v}" for v in range(22, 15, -1)]:
        if shutil.which(name):
            return name
    sys.exit("no llvm-mca 16 or later found (apt-get install llvm-19), or pass --mca")


def cycles_per_256(mca: str, cpu: str, asm: str, iterations: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write(asm)
    try:
        r = subprocess.run([mca, f"-mcpu={cpu}", f"-iterations={iterations}", f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if r.returncode != 0 or "Total Cycles" not in r.stdout or "is not a recognized processor" in r.stderr:
        sys.exit(f"{mca} -mcpu={cpu}: {r.stderr.strip().splitlines()[0] if r.stderr.strip() else 'failed'}")
    total = int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1))
    return total / iterations / (asm.count("vpmaddubsw") / 8)


def innermost_loop(body: List[Tuple[Optional[str], str]], min_maddubs: int) -> List[str]:
    """The shortest [target, jump) of a backward jump holding >= min_maddubs vpmaddubsw, jumps left out."""
    labels = {lab: i for i, (lab, _) in enumerate(body) if lab is not None}
    best = None
    for j, (_, t) in enumerate(body):
        m = re.match(r"\s*j\w+\s+(\.L\d+)", t)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            i = labels[m.group(1)]
            if sum("vpmaddubsw" in x for _, x in body[i:j]) >= min_maddubs and (best is None or j - i < best[1] - best[0]):
                best = (i, j)
    if best is None:
        raise RuntimeError("no loop with enough vpmaddubsw")
    return [t.strip() for lab, t in body[best[0]:best[1]] if lab is None and not re.match(r"\s*j\w+", t)]


def parse_functions(text: str) -> Dict[str, List[Tuple[Optional[str], str]]]:
    """Each mangled function of a .s file: its lines, labels as (label, "") and instructions as (None, line)."""
    funcs: Dict[str, List[Tuple[Optional[str], str]]] = {}
    cur = None
    for line in text.split("\n"):
        m = re.match(r"^(_Z\S+):$", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        if cur is None or not line.strip() or re.match(r"^\s+\.", line):
            continue
        lab = re.match(r"^(\.L\d+):", line)
        funcs[cur].append((lab.group(1), "") if lab else (None, line))
    return funcs


def compile_functions(cxx: str, cpp: str) -> Dict[str, List[Tuple[Optional[str], str]]]:
    """cpp compiled to assembly as the library compiles its kernels (-O3, cpp/src on the include path)."""
    with tempfile.TemporaryDirectory() as d:
        s = os.path.join(d, "out.s")
        r = subprocess.run([cxx, "-std=c++17", "-O3", "-DNDEBUG", "-S", "-I", os.path.join(ROOT, "cpp/src"), "-I",
                            os.path.join(ROOT, "cpp/include"), cpp, "-o", s], capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(s):   # e.g. a compiler for another target: the error, one line
            err = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[-200:])
            sys.exit(f"{cxx} could not compile {os.path.basename(cpp)}: {err}")
        return parse_functions(open(s).read())


def compiled_tiles(cxx: str, headers: List[str], tiles: Dict[str, Tuple[str, str]]) -> Dict[str, List[str]]:
    """{type: innermost group loop} of the AVX2 tiles ``tiles`` ({type: (C++ name, c++filt's name)}), each's
    ``Micro<8, 1>`` instantiated from ``headers`` and compiled as the library compiles its kernels."""
    src = ("#define MOE_ISA avx2\n" + "".join(f'#include "{h}"\n' for h in headers) + "MOE_ISA_BEGIN\n"
           + "".join(f"template struct {t}::Micro<8, 1>;\n" for t, _ in tiles.values()) + "MOE_ISA_END\n")
    with tempfile.TemporaryDirectory() as d:
        cpp = os.path.join(d, "tiles.cpp")
        open(cpp, "w").write(src)
        funcs = compile_functions(cxx, cpp)
    names = list(funcs)
    demangled = dict(zip(names, subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                                               check=True).stdout.split("\n")))
    out = {}
    for typ, (t, shown) in tiles.items():
        name = next((n for n in names if f"{shown}::Micro<8, 1>::run" in demangled[n]), None)
        if name is None:
            raise RuntimeError(f"no compiled tile for {typ} ({t})")
        out[typ] = innermost_loop(funcs[name], 64)
    return out


def runs_loops(cxx: str) -> Dict[str, List[str]]:
    """kernels/int_avx2_runs.h's 8-row tile for Q4_K (integer mins) at 256-blocks (one block a run): its group loop."""
    t = "IntAvx2Runs<1, true, 8>"
    return compiled_tiles(cxx, ["kernels/int_avx2_runs.h"], {"Q4_K": (t, t)})


def ours_loops(cxx: str) -> Dict[str, List[str]]:
    # c++filt writes IntAvx2G32<true, (moe_cpu::kernels::avx2::Codes)3, 1, 2, 1, 1>
    tiles = {typ: (f"IntAvx2G32<{t[0]}, Codes::{t[1]}, {t[2]}, {t[3]}, {t[4]}, {t[5]}>",
                   f"IntAvx2G32<{t[0]}, (moe_cpu::kernels::avx2::Codes){CODES[t[1]]}, {t[2]}, {t[3]}, {TERMS[t[4]]}, {t[5]}>")
             for typ, t in OURS.items()}
    return compiled_tiles(cxx, ["kernels/int_avx2.h", "kernels/int_avx2_g32.h"], tiles)


def check_ik_lib(lib: str) -> None:
    if not os.path.isfile(lib):
        sys.exit(f"--ik-lib {lib!r}: not a file")
    digest = hashlib.sha256(open(lib, "rb").read()).hexdigest()[:16]
    if digest != IK_SHA256:
        sys.exit(f"{lib}: sha256 {digest}..., not the ik-llama-cpp-python==0.1.5 libggml whose loops IK_LOOPS lists")


def ik_loops(lib: str) -> Dict[str, List[Tuple[str, List[str]]]]:
    out: Dict[str, List[Tuple[str, List[str]]]] = {}
    for typ, loops in IK_LOOPS.items():
        for start, share in loops:
            dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={start}",
                                  f"--stop-address={start + 4096}", lib], capture_output=True, text=True, check=True).stdout
            body = []
            for line in dis.split("\n"):
                m = re.match(r"^\s*([0-9a-f]+):\s+(.+)$", line)
                if not m:
                    continue
                t = m.group(2).split("#")[0].strip()
                j = re.match(r"j\w+\s+([0-9a-f]+)", t)
                if j and int(j.group(1), 16) == start:
                    break
                if not t.startswith("j"):
                    body.append(re.sub(r"<[^>]*>", "", t))
            else:
                raise RuntimeError(f"no backward jump to {start:#x}")
            out.setdefault(typ, []).append((f"{start:#x} {share}".strip(), body))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ik-lib", help="the ik wheel's libggml-0b5e5db1.so (its hot loops side by side)")
    ap.add_argument("--mca", help="llvm-mca binary (default: the newest llvm-mca-NN, 16 or later)")
    ap.add_argument("--cpus", default="sapphirerapids,znver3", help="llvm-mca -mcpu models")
    ap.add_argument("--cxx", default="g++", help="the C++ compiler (default g++)")
    ap.add_argument("--iterations", type=int, default=300, help="llvm-mca iterations (default 300)")
    args = ap.parse_args(argv)
    if args.iterations < 1:
        ap.error("--iterations must be >= 1")
    cpus = [c for c in args.cpus.split(",") if c]
    if not cpus:
        ap.error("--cpus: no llvm-mca model given")
    for tool in (args.cxx, "objdump", "c++filt"):
        if not shutil.which(tool):
            ap.error(f"needs {tool} (a C++ compiler and binutils)")
    mca = find_mca(args.mca)
    if args.ik_lib:
        check_ik_lib(args.ik_lib)
    ver = re.search(r"version (\S+)", subprocess.run([mca, "--version"], capture_output=True, text=True).stdout)
    print(f"{mca} ({ver.group(1) if ver else '?'}), "
          f"cycles per 256 products (a row, 32 channels, 8 columns), {args.iterations} iterations")
    ours, runs = ours_loops(args.cxx), runs_loops(args.cxx)
    ik = ik_loops(args.ik_lib) if args.ik_lib else {}
    print(f"{'type':7} {'loop':26} " + " ".join(f"{c:>15}" for c in cpus) + " insns")
    for typ, asm in ours.items():
        rows = [("moe_cpu Micro<8, 1>", asm)] + [(f"ik {name}", body) for name, body in ik.get(typ, [])]
        if typ in runs:
            rows.append(("moe_cpu runs (256-blocks)", runs[typ]))
        for name, body in rows:
            text = "\n".join(body) + "\n"
            print(f"{typ:7} {name:26} " + " ".join(f"{cycles_per_256(mca, c, text, args.iterations):15.2f}" for c in cpus)
                  + f" {len(body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
