"""moe_cpu on model shapes: time, tokens/s, GB/s and GOPS per scheme and M, against this host's bandwidth and peaks.

Also against the reference / NumPy / torch peers (``--no-peers`` leaves them out) and kt-kernel (``--kt-peer``).
The code lives in moe_cpu/bench/ so that the installed ``moe-cpu bench`` runs the same thing (its options below);
this script only writes to bench/out/ by default (bench_moe.json, bench_moe.png; bench_decode.json). docs/performance.md.

    python bench/bench_moe.py --quick
    python bench/bench_moe.py --decode                    # decode hot and cold beside the read bandwidth, every form
    python bench/bench_moe.py --shapes qwen3-30b-a3b --experts 8 --m 1 --schemes int8_w8a8 --no-peers   # quick check
"""
import os
import sys

from moe_cpu.bench.main import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)   # then the options, from moe-cpu bench's own parser (which exits)
    if "--out" not in args and not any(a.startswith("--out=") for a in args):
        args += ["--out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")]
    raise SystemExit(main(args))
