"""moe_cpu.Stream against the blocking fused_experts: idle CPU, submit latency, decode cost, overlap with a GPU.

The CPU half of a hybrid server (issue 34; docs/hybrid.md): what a moe_cpu.Stream costs and what it overlaps, on
the Qwen3-30B-A3B shape (H=2048, I=768, E=128 or --experts, k=8), every figure a ratio or median from this one run.

  idle       the process's CPU time over 2 s of an idle open stream, in % of one core;
  submit     the time Stream.submit takes to return at M=1 (median; the worker idle and spinning, or asleep);
  decode     submit + wait against the blocking fused_experts at M=1, per scheme: blocks of 4 calls alternate
             (ABBA), each call on new routing (cold weights) and timed alone; the ratio of the median call times and
             of their 10th percentiles (paired: the host's swings hit both sides);
  overlap    a GPU stand-in: the caller sleeps T (GIL released, no CPU) between submit and wait, T = 0.5, 1, 2 x
             t_experts. wall / max(T_slept, t_experts), T_slept and t_experts timed alone just before (median triplet);
  loop       KTransformers' decode loop over L layers: submit the routed experts, the "GPU part" (sleep T = t_experts),
             wait, combine; tokens/s against the same loop run serially (sleep, then the blocking call), and with
             kt-kernel's CPUInfer submit / sync in the same loop where kt-kernel 0.7.2 is installed (--kt-peer).

    python bench/stream_overlap.py [--schemes int4_w4a8,...] [--rounds 100] [--layers 4] [--kt-peer]
    python bench/stream_overlap.py --schemes int8_w8a8 --rounds 1 --layers 1 --experts 8 --idle-s 0.1 --tokens 2
                                                                                            # a quick check
"""
import argparse
import importlib.util
import os
import statistics
import time

import numpy as np

import moe_cpu
from moe_cpu.bench.random_forms import random_packed
from moe_cpu.bench.timing import Routing

H, I, E, K = 2048, 768, 128, 8
ALL = ("int4_w4a8", "int8_w8a8", "fp8_w8a16", "bf16", "int4_w4a16", "int8_w8a16")


def steal_ms():
    """CPU time the hypervisor gave other guests (all our CPUs, /proc/stat "steal"), in ms; 0 where unknown."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8]) * 1000.0 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def caller_cpus(t):
    """The two CPUs the caller alternates between, round by round, beside a 1-thread stream (None otherwise). The
    stream computes on another CPU than its caller, the blocking call on the caller's; a VM's vCPUs can differ by up
    to 9% in speed (another guest on one of them), which alternating cancels. Only for t = 1: the blocking calls
    then start no OpenMP threads that would inherit the pinned mask, and the stream's worker exists before."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return cpus[:2] if t == 1 and len(cpus) >= 2 else None


class pinned:
    """Pins the calling thread to `cpu` (None: leaves it) and restores its mask on exit."""
    def __init__(self, cpu):
        self.cpu = cpu

    def __enter__(self):
        if self.cpu is not None:
            self.mask = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {self.cpu})

    def __exit__(self, *exc):
        if self.cpu is not None:
            os.sched_setaffinity(0, self.mask)


def pack(rng, scheme, experts):
    return random_packed(rng, scheme, experts, 2 * I, H), random_packed(rng, scheme, experts, H, I)


def idle_cpu(seconds=2.0):
    with moe_cpu.Stream() as s:
        s.submit(*dummy).wait()          # the worker has run once and gone idle
        t0, c0 = time.perf_counter(), time.process_time()
        time.sleep(seconds)
        return 100 * (time.process_time() - c0) / (time.perf_counter() - t0)


def submit_latency(s, w13, w2, route, x, tw, n=200, gap=0.0):
    """Median time submit() takes to return (gap: seconds slept before each submit, 0: right after a wait)."""
    ts = []
    for _ in range(n):
        ids = route.next(1)
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        h = s.submit(x, w13, w2, tw, ids)
        ts.append(time.perf_counter() - t0)
        h.wait()
    return statistics.median(ts) * 1e6


def decode_ratio(s, w13, w2, route, x, tw, rounds, reps=4):
    """Paired rounds: a block of blocking calls and a block of submit + wait, in ABBA order, each call on new
    routing and timed alone; the first call of a block is not timed (the other side's threads settle). Short blocks
    keep both sides in the same few milliseconds of a noisy host. Returns (ratio of the median call times, ratio of
    their 10th percentiles, the blocking call's median time): the 10th percentile drops the calls another guest
    slowed down, and keeps a cost the stream adds to every call. Beside a 1-thread stream the caller alternates
    between two CPUs (caller_cpus)."""
    a, b = [], []

    def block(fn, times):
        fn(route.next(1))
        for _ in range(reps):
            ids = route.next(1)
            t0 = time.perf_counter()
            fn(ids)
            times.append(time.perf_counter() - t0)

    def blocking(ids):
        moe_cpu.fused_experts(x, w13, w2, tw, ids)

    def streamed(ids):
        s.submit(x, w13, w2, tw, ids).wait()

    cpus = caller_cpus(s.num_threads)
    for i in range(rounds):
        with pinned(cpus and cpus[(i // 2) % 2]):
            for fn, times in ((blocking, a), (streamed, b))[::1 if i % 2 == 0 else -1]:
                block(fn, times)
    pa, pb = np.percentile(a, [10, 50]), np.percentile(b, [10, 50])
    return pb[1] / pa[1], pb[0] / pa[0], pa[1]


def overlap(s, w13, w2, route, x, tw, t_exp, n):
    """Per T: triplets of (sleep T alone, the blocking call alone, submit + sleep T + wait), each triplet's
    wall / max(slept, t_exp); the median triplet. Beside a 1-thread stream the caller alternates between two CPUs
    (caller_cpus)."""
    rows, cpus = [], caller_cpus(s.num_threads)
    for f in (0.5, 1.0, 2.0):
        T, r = f * t_exp, []
        for i in range(n):
            with pinned(cpus and cpus[i % 2]):
                r.append(triplet(s, w13, w2, route, x, tw, T))
        med = sorted(r)[len(r) // 2]
        rows.append((f, *med))
    return rows


def triplet(s, w13, w2, route, x, tw, T):
    """(wall / max(slept, te), wall, slept, te): sleep T alone, the blocking call alone (te), submit + sleep + wait."""
    t0 = time.perf_counter()
    time.sleep(T)
    slept = time.perf_counter() - t0
    ids = route.next(1)
    t0 = time.perf_counter()
    moe_cpu.fused_experts(x, w13, w2, tw, ids)
    te = time.perf_counter() - t0
    ids = route.next(1)
    t0 = time.perf_counter()
    h = s.submit(x, w13, w2, tw, ids)
    time.sleep(T)
    h.wait()
    wall = time.perf_counter() - t0
    return wall / max(slept, te), wall, slept, te


def spin_sweep(w13, w2, route, x, tw, rounds, spins=(0, 50, 200, 1000, 3000), n=100):
    """Per spin_us: submit latency after idle gaps, the CPU the worker burns in a gap, and the decode ratio of a
    stream that leaves the caller a processor (its wait polls)."""
    t = max(1, moe_cpu.get_num_threads() - 1)
    print(f"\nspin_us: submit at M=1 (median of {n}, us) after an idle gap, the CPU time of a 2 ms gap after a task, "
          f"and the decode ratio of a {t}-thread stream")
    gaps = (0.0, 0.0005, 0.002)
    print(f"{'spin_us':>8}" + "".join(f"{'gap %.1f ms' % (g * 1e3):>13}" for g in gaps) + f"{'cpu/gap 2ms':>13}"
          + f"{'ratio t=%d' % t:>11}")
    for spin in spins:
        n_all = moe_cpu.get_num_threads()
        moe_cpu.set_num_threads(t)
        try:
            with moe_cpu.Stream(t, spin_us=spin) as s:
                ratio = decode_ratio(s, w13, w2, route, x, tw, rounds)[0]
        finally:
            moe_cpu.set_num_threads(n_all)
        with moe_cpu.Stream(spin_us=spin) as s:
            lat = [submit_latency(s, w13, w2, route, x, tw, n=n, gap=g) for g in gaps]
            burn = 0.0
            for _ in range(20):   # a task, then 2 ms idle: the CPU time spent while the caller sleeps
                s.submit(x, w13, w2, tw, route.next(1)).wait()
                c0 = time.process_time()
                time.sleep(0.002)
                burn += (time.process_time() - c0) / 20
        print(f"{spin:8d}" + "".join(f"{v:13.1f}" for v in lat) + f"{burn * 1e3:10.3f} ms" + f"{ratio:11.3f}")


def layer_loop(step, layers, tokens, rounds=5):
    """Tokens/s of `step(layer_index, x) -> x` over `layers` layers, median of `rounds` runs of `tokens` tokens."""
    rates = []
    for _ in range(rounds):
        x = dummy[0].copy()
        t0 = time.perf_counter()
        for _ in range(tokens):
            for li in range(layers):
                x = step(li, x)
        rates.append(tokens / (time.perf_counter() - t0))
    return statistics.median(rates)


def main(argv=None) -> int:
    global dummy
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default=",".join(ALL), help=f"comma-separated (default {','.join(ALL)})")
    ap.add_argument("--rounds", type=int, default=100, help="ABBA rounds of the decode table (default 100)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the decode loop (default 4)")
    ap.add_argument("--tokens", type=int, default=30, help="tokens per run of the decode loop (default 30)")
    ap.add_argument("--experts", type=int, default=E, help=f"experts per layer (default {E}; at least top-k {K})")
    ap.add_argument("--idle-s", type=float, default=2.0, help="seconds the idle stream is watched (default 2)")
    ap.add_argument("--kt-peer", action="store_true", help="also kt-kernel's CPUInfer in the decode loop")
    ap.add_argument("--spin-sweep", action="store_true", help="submit latency and idle CPU per spin_us")
    a = ap.parse_args(argv)
    schemes = a.schemes.split(",")
    bad = [s for s in schemes if s not in ALL]
    if bad:
        ap.error(f"--schemes: unknown {bad[0]!r}; choose from {', '.join(ALL)}")
    if a.rounds < 1 or a.layers < 1 or a.tokens < 1:
        ap.error("--rounds, --layers and --tokens must be >= 1")
    if a.experts < K:
        ap.error(f"--experts {a.experts} must be >= the top-k of {K}")
    if a.idle_s <= 0:
        ap.error("--idle-s must be > 0")
    if a.kt_peer and importlib.util.find_spec("kt_kernel") is None:
        ap.error("--kt-peer: kt-kernel is not installed (pip install kt-kernel==0.7.2 --no-deps)")
    rng = np.random.default_rng(0)
    n = moe_cpu.get_num_threads()
    x = rng.standard_normal((1, H), dtype=np.float32)
    tw = np.full((1, K), 1.0 / K, np.float32)
    print(f"{n} threads, Qwen3-30B-A3B shape H={H} I={I} E={a.experts} k={K}; "
          f"spin_us={moe_cpu.stream.DEFAULT_SPIN_US}")
    packed = {sch: pack(rng, sch, a.experts) for sch in schemes}
    w13, w2 = packed[schemes[0]]
    dummy = (x, w13, w2, tw, np.arange(K, dtype=np.int32)[None])
    print(f"\nidle: an open stream uses {idle_cpu(a.idle_s):.2f}% of a core (process CPU time over {a.idle_s:g} s)")

    route = Routing(rng, a.experts, K)
    st0 = steal_ms()
    counts = sorted({n, max(1, n - 1)}, reverse=True)
    print(f"\ndecode M=1: submit + wait / blocking fused_experts (both on t threads), {a.rounds} ABBA rounds of "
          f"blocks of 4 calls; ratios of the median call times (p50) and of their 10th percentiles (p10)")
    print(f"{'scheme':>12} {'kernel':>22}" + "".join(f"{'blocking ms t=%d' % t:>18}{'p50':>7}{'p10':>7}"
                                                      for t in counts))
    for sch in schemes:
        p13, p2 = packed[sch]
        row = f"{sch:>12} {p13.kernel:>22}"
        for t in counts:
            moe_cpu.set_num_threads(t)
            try:
                with moe_cpu.Stream(t) as s:
                    r, r10, tb = decode_ratio(s, p13, p2, route, x, tw, a.rounds)
            finally:
                moe_cpu.set_num_threads(n)
            row += f"{tb * 1e3:18.3f}{r:7.3f}{r10:7.3f}"
        print(row)
    print(f"(steal time during the table: {steal_ms() - st0:.0f} ms)")
    sch = schemes[0]
    if a.spin_sweep:
        spin_sweep(w13, w2, route, x, tw, max(4, a.rounds // 2))
    # A stream of n threads leaves the caller no core of its own on an n-core host; n - 1 threads leave it one.
    for nt in counts:
        moe_cpu.set_num_threads(nt)   # the blocking calls that t_exp and the serial loop time
        try:
            with moe_cpu.Stream(nt) as s:
                overlap_section(s, nt, rng, sch, w13, w2, route, x, tw, a)
        finally:
            moe_cpu.set_num_threads(n)
    return 0


def overlap_section(s, nt, rng, sch, w13, w2, route, x, tw, a):
    st0 = steal_ms()
    print(f"\n== a stream of {nt} threads ({sch}); blocking calls on {nt} threads")
    print(f"submit at M=1, median of 200: {submit_latency(s, w13, w2, route, x, tw):.1f} us right after a wait "
          f"(worker polling), {submit_latency(s, w13, w2, route, x, tw, n=100, gap=0.002):.1f} us after 2 ms "
          f"idle (worker asleep)")
    t_exp = statistics.median(timed_blocking(w13, w2, route, x, tw) for _ in range(5))
    print(f"GPU stand-in: submit, sleep T, wait; the median of {a.rounds * 2} triplets; t_exp {t_exp * 1e3:.3f} ms")
    print(f"{'T/t_exp':>8} {'wall/max':>9} {'wall ms':>8} {'T slept ms':>11} {'t_exp ms':>9}")
    for f, ratio, wall, slept, te in overlap(s, w13, w2, route, x, tw, t_exp, a.rounds * 2):
        print(f"{f:8.1f} {ratio:9.3f} {wall * 1e3:8.3f} {slept * 1e3:11.3f} {te * 1e3:9.3f}")

    L, T, experts, tokens = a.layers, t_exp, a.experts, a.tokens
    layers = [pack(rng, sch, experts) for _ in range(L - 1)] + [(w13, w2)]
    gate = rng.standard_normal((experts, H), dtype=np.float32) * 0.02
    mlayers = [moe_cpu.MoELayer(gate, l13, l2, top_k=K) for l13, l2 in layers]
    routes = [Routing(rng, experts, K) for _ in range(L)]

    def serial(li, x):
        time.sleep(T)   # the GPU part
        return x + 1e-3 * moe_cpu.fused_experts(x, *layers[li], tw, routes[li].next(1))

    def streamed(li, x):
        h = s.submit(x, *layers[li], tw, routes[li].next(1))
        time.sleep(T)
        return x + 1e-3 * h.wait()

    def layer_serial(li, x):
        time.sleep(T)
        return x + 1e-3 * mlayers[li](x)

    def layer_streamed(li, x):
        h = mlayers[li].submit(x, s)
        time.sleep(T)
        return x + 1e-3 * h.wait()

    print(f"decode loop, {L} layers, GPU part T = t_exp per layer; tokens/s, median of 5 runs of {tokens} tokens "
          f"(ideal overlap: 2x)")
    ser, st = layer_loop(serial, L, tokens), layer_loop(streamed, L, tokens)
    print(f"  fused_experts, routing given:  serial {ser:7.1f}  stream {st:7.1f}  x{st / ser:.2f}")
    ser, st = layer_loop(layer_serial, L, tokens), layer_loop(layer_streamed, L, tokens)
    print(f"  MoELayer (router on the CPU):  serial {ser:7.1f}  stream {st:7.1f}  x{st / ser:.2f}")
    if a.kt_peer:
        kt_loop(rng, nt, L, T, sch, experts, tokens)
    print(f"(steal time during this section: {steal_ms() - st0:.0f} ms)")


def timed_blocking(w13, w2, route, x, tw, reps=20):
    t0 = time.perf_counter()
    for _ in range(reps):
        moe_cpu.fused_experts(x, w13, w2, tw, route.next(1))
    return (time.perf_counter() - t0) / reps


def kt_loop(rng, n, L, T, sch, E, tokens):
    """The same loop on kt-kernel's CPUInfer(n): submit forward_task, sleep T, sync."""
    from moe_cpu.bench import kt_peer
    from moe_cpu._dtypes import to_bf16_bits

    info = kt_peer.probe()
    if isinstance(info, str) or sch not in info["ran"] or kt_peer.KT[sch] == "GPTQ_CLASS":
        print(f"\nkt-kernel: not run for {sch} ({info if isinstance(info, str) else 'no such class here'})")
        return
    w = [to_bf16_bits(rng.standard_normal(shp, dtype=np.float32) * 0.02) for shp in ((E, I, H), (E, I, H), (E, H, I))]
    kt = kt_peer.KtMoE(kt_peer.KT[sch], n, K, *w, 1)
    route = Routing(rng, E, K)
    xb, out = to_bf16_bits(np.zeros((1, H), np.float32)), np.zeros((1, H), np.uint16)
    m, tw = np.array([1], np.int64), np.full((1, K), 1.0 / K, np.float32)

    def call(wait_fn):
        ids = route.next(1).astype(np.int64)
        kt.cpu.submit(kt.moe.forward_task(m.ctypes.data, K, ids.ctypes.data, tw.ctypes.data, xb.ctypes.data,
                                          out.ctypes.data, False))
        wait_fn()
        kt.cpu.sync()

    def serial(li, x):
        time.sleep(T)
        call(lambda: None)
        return x

    def streamed(li, x):
        call(lambda: time.sleep(T))
        return x

    ser, st = layer_loop(serial, L, tokens), layer_loop(streamed, L, tokens)
    print(f"  kt-kernel {kt_peer.KT[sch]} CPUInfer({n}) (one layer's weights, {L} calls per token): "
          f"serial {ser:7.1f}  overlapped {st:7.1f}  x{st / ser:.2f}")
    kt.close()


if __name__ == "__main__":
    raise SystemExit(main())
