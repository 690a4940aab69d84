"""A16 against A8 on the same codes: time of a Qwen3-30B-A3B MoE layer (A16 / A8) and its share of bandwidth / peaks.

Issue 33; docs/performance.md. One MoE layer packed twice from the same codes, as int4_w4a8 and int4_w4a16 (or
int8_w8a8 / int8_w8a16). Calls alternate (A8, A16, A8, ...), each round with a new routing; the reported ratio is
the median of the per-round A16 / A8 time ratios (paired, so the shared host's swings cancel). Beside it, in the
same run:
  decode (M <= 16): the weight bytes the call reads per second over the read bandwidth measured just before;
  prefill: the multiply-adds per second over the peak of vdpbf16ps zmm (AVX-512 BF16; vfmadd231ps ymm on the
  AVX2 tier), the float peak issue 33 holds A16 to, and over the kernel's own instruction (vpdpwssd / vpmaddwd).

    python bench/a16_vs_a8.py [--weights int4,int8] [--m 1,4,16,64,256,1024] [--rounds 9] [--experts 128]
    python bench/a16_vs_a8.py --weights int4 --m 1 --rounds 1 --experts 8 --bw-bytes 67108864   # a quick check
"""
import argparse
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu import _core
from moe_cpu.bench.peaks import kernel_isa, peak_insn
from moe_cpu.bench.timing import Routing, weight_bytes
from moe_cpu._argtypes import token_counts

E, H, I, K_TOP = 128, 2048, 768, 8   # Qwen3-30B-A3B


def pack(rng, kind, E):
    """(A8, A16) PackedExperts pairs (w13, w2) of the same random codes: int4 g128 or int8 per channel."""
    out = {}
    for name, (N, K) in (("w13", (2 * I, H)), ("w2", (H, I))):
        if kind == "int4":
            q = rng.integers(-8, 8, (E, N, K), dtype=np.int8)
            s = rng.random((E, N, K // 128), dtype=np.float32) * 0.01
            out[name] = [moe_cpu.pack_int4(q, s, 128, scheme=sch) for sch in ("int4_w4a8", "int4_w4a16")]
        else:
            q = rng.integers(-127, 128, (E, N, K), dtype=np.int8)
            s = rng.random((E, N), dtype=np.float32) * 0.01
            out[name] = [moe_cpu.pack_int8(q, s, scheme=sch) for sch in ("int8_w8a8", "int8_w8a16")]
    return [(out["w13"][i], out["w2"][i]) for i in (0, 1)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default="int4,int8", help="int4 (g128) and / or int8 (per channel); default both")
    ap.add_argument("--m", type=token_counts, default="1,4,16,64,256,1024", help="token counts (default 1,4,16,64,256,1024)")
    ap.add_argument("--rounds", type=int, default=9, help="paired rounds per M (default 9)")
    ap.add_argument("--experts", type=int, default=E, help=f"experts (default {E}; at least top-k {K_TOP})")
    ap.add_argument("--bw-bytes", type=int, default=1 << 30, help="read-bandwidth buffer for decode (default 1 GiB)")
    a = ap.parse_args(argv)
    kinds = a.weights.split(",")
    bad = [k for k in kinds if k not in ("int4", "int8")]
    if bad:
        ap.error(f"--weights: unknown {bad[0]!r}; choose from int4, int8")
    Ms = a.m
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    if a.experts < K_TOP:
        ap.error(f"--experts {a.experts} must be >= the top-k of {K_TOP}")
    if a.bw_bytes < 1 << 20:
        ap.error("--bw-bytes must be >= 1 MiB")
    rng = np.random.default_rng(0)
    threads = moe_cpu.get_num_threads()
    buf = _core.ReadBuffer(a.bw_bytes)
    avail = {p["name"] for p in _core.peak_instructions() if p["available"]}
    print(f"{threads} threads, Qwen3-30B-A3B shape H={H} I={I} E={a.experts} k={K_TOP}")
    for kind in kinds:
        (a13, a2), (b13, b2) = pack(rng, kind, a.experts)
        insn = peak_insn(b13.kernel)
        # the tier's float peak: vdpbf16ps on AVX-512 BF16, else vfmadd231ps ymm
        fpeak = "vdpbf16ps_zmm" if kernel_isa(b13.kernel) != "avx2" and "vdpbf16ps_zmm" in avail else "fma_ymm"
        print(f"\n{kind}: A8 {a13.kernel}, A16 {b13.kernel} ({(a13.nbytes + a2.nbytes) / 2**20:.0f} MiB); "
              f"%fpeak of {fpeak}, %own of {insn}")
        print(f"{'M':>5} {'A8 ms':>8} {'A16 ms':>8} {'A16/A8':>7} {'A8 %bw':>7} {'A16 %bw':>8} "
              f"{'A16 %fpeak':>10} {'A16 %own':>9}")
        route = Routing(rng, a.experts, K_TOP)
        for M in Ms:
            x = rng.standard_normal((M, H), dtype=np.float32)
            tw = np.full((M, K_TOP), 1.0 / K_TOP, np.float32)
            reps = max(1, min(40, int(64 / M)))   # calls per measurement: decode takes ~1 ms
            ratios, t8s, t16s, bw8, bw16, fp, own = [], [], [], [], [], [], []
            ops = 2.0 * M * K_TOP * 3 * I * H
            for _ in range(a.rounds):
                idss = [route.next(M) for _ in range(reps)]
                gb = float(np.mean([weight_bytes(a13, a2, ids) for ids in idss]))
                t = []
                for w13, w2 in ((a13, a2), (b13, b2)):
                    moe_cpu.fused_experts(x, w13, w2, tw, idss[0])
                    t0 = time.perf_counter()
                    for ids in idss:
                        moe_cpu.fused_experts(x, w13, w2, tw, ids)
                    t.append((time.perf_counter() - t0) / reps)
                t8s.append(t[0]), t16s.append(t[1]), ratios.append(t[1] / t[0])
                if M <= 16:
                    read = buf.read_gbs(threads, 1)
                    bw8.append(gb / t[0] / 1e9 / read), bw16.append(gb / t[1] / 1e9 / read)
                else:
                    fp.append(ops / t[1] / 1e12 / _core.instruction_peak_tops(fpeak, threads, 0.05))
                    if insn:
                        own.append(ops / t[1] / 1e12 / _core.instruction_peak_tops(insn, threads, 0.05))
            med = statistics.median
            pct = lambda v: f"{100 * med(v):.0f}%" if v else "-"  # noqa: E731
            print(f"{M:>5} {1e3 * med(t8s):>8.3f} {1e3 * med(t16s):>8.3f} {med(ratios):>7.3f} {pct(bw8):>7} "
                  f"{pct(bw16):>8} {pct(fp):>10} {pct(own):>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
