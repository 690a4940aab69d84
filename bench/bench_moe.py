"""The model-shape benchmark (docs/performance.md); the code lives in moe_cpu/bench/ so that the
installed `moe-cpu bench` runs the same thing. Output goes to bench/out/ by default."""
import os
import sys

from moe_cpu.bench.main import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")]
    raise SystemExit(main(args))
