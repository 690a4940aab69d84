"""kt-kernel (KTransformers' CPU MoE kernels) as an optional peer: `pip install kt-kernel==0.7.2 --no-deps`.

Driven with NumPy pointers through its extension module (MOEConfig, the *_MOE classes, CPUInfer
submit / sync). The kt_kernel package is located, never imported (its __init__ imports torch): kt's own
_cpu_detect.py picks and loads the module for this CPU, after a subprocess has run each class once
(a module this CPU cannot run dies there, not here)."""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from importlib import metadata

import numpy as np

from .. import _core, api
from .._dtypes import from_bf16_bits, to_bf16_bits
from .peers import numpy_peer
from .shapes import SHAPES
from .timing import Routing, timed

# scheme -> kt class. kt quantizes the bf16 weights itself: int8 / int4 with one scale per output row
# and int8 activations, bf16 as given; moe_cpu gets the same weights at the same granularity. int4_w4a16: kt's
# GPTQ int4 class (symmetric GPTQ qweight / scales, group 128, bf16 activations: its W4A16) on the same codes as
# moe_cpu's int4_w4a16 (GPTQ_CLASS: the class kt itself would pick for this CPU).
KT = {"int8_w8a8": "AMXInt8_MOE", "int4_w4a8": "AMXInt4_MOE", "bf16": "AMXBF16_MOE", "int4_w4a16": "GPTQ_CLASS"}
OURS = {"int8_w8a8": -1, "int4_w4a8": -1, "bf16": None, "int4_w4a16": 128}   # moe_cpu group_size (-1: per output row)
INSTALL = "pip install kt-kernel==0.7.2 --no-deps"
_ext = []
_kt_csr = []   # MXCSR after loading kt's module


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@contextlib.contextmanager
def _quiet():
    """kt printf()s when it builds and frees things: fd 1 goes to /dev/null meanwhile."""
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _mxcsr():
    return _core.mxcsr() if hasattr(_core, "mxcsr") else None


def load_ext():
    """kt's extension module for this CPU, as kt_kernel/__init__ would pick it (without its torch import).
    Loading it sets flush-to-zero and denormals-are-zero in the calling thread (seen on kt 0.7.2's AMX module);
    the thread's MXCSR is put back after, so the rest of the process keeps IEEE subnormals, and kt's CPUInfer
    threads are started in kt's mode (_kt_mode)."""
    if not _ext:
        before = _mxcsr()
        if "kt_kernel_ext" in sys.modules:  # kt_kernel itself was imported: a second load would clash
            _ext.append(sys.modules["kt_kernel_ext"])
        else:
            where = importlib.util.find_spec("kt_kernel").submodule_search_locations[0]
            spec = importlib.util.spec_from_file_location("_kt_cpu_detect", os.path.join(where, "_cpu_detect.py"))
            detect = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(detect)
            _ext.append(detect.initialize()[0])
        _kt_csr.append(_mxcsr())
        if before is not None:
            _core.set_mxcsr(before)
    return _ext[0]


@contextlib.contextmanager
def _kt_mode():
    """The MXCSR kt's module left, for starting kt's threads as kt would (they inherit it)."""
    before = _mxcsr()
    if before is not None and _kt_csr and _kt_csr[0] is not None:
        _core.set_mxcsr(_kt_csr[0])
    try:
        yield
    finally:
        if before is not None:
            _core.set_mxcsr(before)


class KtMoE:
    """One kt layer on its own CPUInfer(threads): bf16 gate, up [E, I, H] and down [E, H, I] (uint16 bits)."""

    def __init__(self, name, threads, k, gate, up, down, max_m):
        ext = load_ext()
        E, I, H = gate.shape
        self.k, self.keep = k, (gate, up, down)
        with _quiet():
            with _kt_mode():   # its threads start in kt's float mode
                self.cpu = ext.CPUInfer(threads)
            cfg = ext.moe.MOEConfig(E, k, H, I, 0)       # 0: no GPU-expert mask
            cfg.max_len = -(-max_m // 32) * 32             # kt's row buffers: a multiple of 32 rows
            cfg.gate_proj, cfg.up_proj, cfg.down_proj = gate.ctypes.data, up.ctypes.data, down.ctypes.data
            cfg.pool = self.cpu.backend_
            self.moe = getattr(ext.moe, name)(cfg)
            self.experts = np.arange(E, dtype=np.int64)    # physical -> logical expert map
            self.cpu.submit(self.moe.load_weights_task(self.experts.ctypes.data))  # kt quantizes here
            self.cpu.sync()

    def __call__(self, x, ids, tw, out):
        """x, out: [M, H] bf16 bits; ids: int64 [M, k]; tw: float32 [M, k]."""
        m = np.array([x.shape[0]], np.int64)
        self.cpu.submit(self.moe.forward_task(m.ctypes.data, self.k, ids.ctypes.data, tw.ctypes.data,
                                              x.ctypes.data, out.ctypes.data, False))
        self.cpu.sync()
        return out

    def close(self):
        with _quiet():
            del self.moe, self.cpu


def gptq_class(ext):
    """kt's GPTQ int4 class for this CPU, as its loader picks it for group 128: AVX-VNNI-256 where the CPU
    has AVX-VNNI, else AVX2 (None without either)."""
    vnni = "avx_vnni" in api.cpu_features()["detected"]
    for name in (("AVXVNNI256GPTQInt4_MOE",) if vnni else ()) + ("AVX2GPTQInt4_MOE",):
        if hasattr(ext.moe, name):
            return name
    return None


def gptq_tensors(q, s):
    """Symmetric GPTQ tensors of codes q int8 [E, N, K] in [-8, 7] and scales s [E, N, G]: per expert qweight int32
    [K/8, N] (8 nibbles q + 8 along K per word, the lowest first) and float32 scales [G, N]."""
    E, N, K = q.shape
    u = (q.astype(np.int32) + 8).astype(np.uint32).reshape(E, N, K // 8, 8)
    words = np.zeros((E, N, K // 8), np.uint32)
    for i in range(8):
        words |= u[..., i] << np.uint32(4 * i)
    return ([np.ascontiguousarray(words[e].T).view(np.int32) for e in range(E)],
            [np.ascontiguousarray(s[e].T) for e in range(E)])


class KtGptq(KtMoE):
    """kt's GPTQ int4 class on symmetric codes: gate / up q [E, I, H], down [E, H, I], scales [E, N, G]."""

    def __init__(self, threads, k, gate, up, down, max_m, group=128):
        ext = load_ext()
        (qg, sg), (qu, su), (qd, sd) = gate, up, down
        E, I, H = qg.shape
        self.k = k
        self.keep = [gptq_tensors(q, s) for q, s in ((qg, sg), (qu, su), (qd, sd))]
        with _quiet():
            with _kt_mode():   # its threads start in kt's float mode
                self.cpu = ext.CPUInfer(threads)
            cfg = ext.moe.MOEConfig(E, k, H, I, 0)
            cfg.max_len = -(-max_m // 32) * 32
            (gw, gs), (uw, us), (dw, ds) = self.keep
            cfg.gate_projs, cfg.up_projs, cfg.down_projs = ([[a.ctypes.data for a in t]] for t in (gw, uw, dw))
            cfg.gate_scales, cfg.up_scales, cfg.down_scales = ([[a.ctypes.data for a in t]] for t in (gs, us, ds))
            cfg.quant_config.bits, cfg.quant_config.group_size, cfg.quant_config.zero_point = 4, group, False
            cfg.pool = self.cpu.backend_
            self.moe = getattr(ext.moe, gptq_class(ext))(cfg)
            self.experts = np.arange(E, dtype=np.int64)
            self.cpu.submit(self.moe.load_weights_task(self.experts.ctypes.data))
            self.cpu.sync()


def _gptq_codes(rng, E, N, K, group=128):
    q = rng.integers(-8, 8, (E, N, K), dtype=np.int8)
    s = (rng.uniform(0.5, 1.5, (E, N, K // group)) / (4 * np.sqrt(K))).astype(np.float32)
    return q, s


def _probe():
    """Run in a subprocess: each kt class once on a tiny layer, at M = 1 and M = 40 (kt's two GEMM paths)."""
    ext = load_ext()
    module = os.path.basename(ext.__file__).split(".")[0]
    print("KT_MODULE", module, flush=True)
    rng = np.random.default_rng(0)
    E, k, H, I = 2, 1, 256, 128
    w = [to_bf16_bits(rng.standard_normal(s, dtype=np.float32) * 0.05) for s in ((E, I, H), (E, I, H), (E, H, I))]
    ran = []
    for scheme, name in KT.items():
        if name == "GPTQ_CLASS" and gptq_class(ext):
            print("KT_TRY", gptq_class(ext), flush=True)
            kt = KtGptq(1, k, _gptq_codes(rng, E, I, H), _gptq_codes(rng, E, I, H), _gptq_codes(rng, E, H, I), 40)
        elif hasattr(ext.moe, name):
            print("KT_TRY", name, flush=True)
            kt = KtMoE(name, 1, k, *w, 40)
        else:
            continue
        for M in (1, 40):
            kt(to_bf16_bits(rng.standard_normal((M, H), dtype=np.float32)), np.zeros((M, k), np.int64),
               np.ones((M, k), np.float32), np.zeros((M, H), np.uint16))
        kt.close()
        ran.append(scheme)
    print("KT_OK", json.dumps({"variant": str(getattr(ext, "__cpu_variant__", "?")), "module": module, "ran": ran}))


def probe():
    """What kt runs on this CPU, tried in a subprocess: a dict, or a string saying why none."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # imports this moe_cpu
    try:
        res = subprocess.run([sys.executable, "-c", "from moe_cpu.bench.kt_peer import _probe; _probe()"],
                             cwd=root, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "kt-kernel's probe did not finish in 600 s"
    lines = res.stdout.splitlines()
    ok = [ln[6:] for ln in lines if ln.startswith("KT_OK ")]
    if res.returncode == 0 and ok:
        return json.loads(ok[-1])
    module = [ln[10:] for ln in lines if ln.startswith("KT_MODULE ")]
    tried = [ln[7:] for ln in lines if ln.startswith("KT_TRY ")]
    how = (f"died of {signal.Signals(-res.returncode).name}" if res.returncode < 0
           else (res.stderr.strip().splitlines() or ["exit status %d" % res.returncode])[-1])
    return (f"kt-kernel has no usable module for this CPU: "
            + (f"running {tried[-1]} of {module[-1]}" if tried else "loading kt's pick") + f" {how}")


def kt_peer(rng, threads, ms=(1, 128, 1024), schemes=tuple(KT), experts=None, min_time=0.2):
    """Qwen3-30B-A3B shape (`experts`: fewer experts): moe_cpu against kt-kernel, both given the same bf16
    weights (each quantizes them itself) and the same routing, timed interleaved; kt on CPUInfer(threads)
    and on CPUInfer(1), as kt runs a polling dispatcher thread besides its workers. Both outputs are
    checked against float32. Returns [] where kt-kernel is not installed or cannot run here."""
    try:
        found = importlib.util.find_spec("kt_kernel") is not None
    except ValueError:  # a kt_kernel module without a spec
        found = False
    if not found:
        print(f"\nkt-kernel peer: kt-kernel is not installed ({INSTALL})")
        return []
    want = [s for s in schemes if s in KT]
    if not want:
        print(f"\nkt-kernel peer: none of {', '.join(schemes)} is a scheme kt has ({', '.join(KT)})")
        return []
    info = probe()
    if isinstance(info, str):
        print(f"\nkt-kernel peer: {info}")
        return []
    for s in want:
        if s not in info["ran"]:
            print(f"\nkt-kernel peer: {info['module']} has no runnable {KT[s]}: no {s} rows")
    want = [s for s in want if s in info["ran"]]
    try:
        kv = metadata.version("kt-kernel")
    except metadata.PackageNotFoundError:
        kv = "?"
    H, I, _, k, E_model, _ = SHAPES["qwen3-30b-a3b"]
    E = experts or E_model
    if E < k:
        raise ValueError(f"kt peer: {E} experts is below the top-k of {k}")
    pools = sorted({threads, 1}, reverse=True)
    w13f = from_bf16_bits(to_bf16_bits(rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.02))  # bf16 values
    w2f = from_bf16_bits(to_bf16_bits(rng.standard_normal((E, H, I), dtype=np.float32) * 0.02))
    gate, up, down = (to_bf16_bits(a) for a in (w13f[:, :I], w13f[:, I:], w2f))
    route, inputs = Routing(rng, E, k), {}
    for M in ms:  # bf16 tokens, random router weights, 64 routings (M = 1: cold experts), a float32 reference
        x = to_bf16_bits(rng.standard_normal((M, H), dtype=np.float32))
        tw = rng.random((M, k), dtype=np.float32) + 0.1
        tw /= tw.sum(1, keepdims=True)
        calls = [route.next(M).astype(np.int64) for _ in range(64)]
        inputs[M] = (x, tw, calls, numpy_peer(from_bf16_bits(x), w13f, w2f, tw, calls[0]))
    print(f"\nkt-kernel {kv} peer: {info['module']} (kt's pick for this CPU), qwen3-30b-a3b shape with E={E}"
          f"{'' if E == E_model else f' (fewer experts than the model: {E_model})'}; same bf16 weights and routing, "
          "int8 / int4 one scale per output row on both sides (int4_w4a16: GPTQ int4 g128 codes, kt's "
          f"{gptq_class(load_ext()) or 'no GPTQ class'})")
    print(f"ms per call: moe_cpu on {threads} threads; kt CPUInfer(n) = n workers plus kt's dispatcher thread; "
          "kt/ours > 1: moe_cpu faster; relative errors against float32 (ours, kt) and kt against ours")
    head = "".join(f"{'kt CPUInfer(%d)' % n:>16}" for n in pools) + "".join(f"{'kt/ours (%d)' % n:>13}" for n in pools)
    print(f"{'scheme':<10} {'M':>5} {'moe_cpu':>9}{head} {'err ours':>9} {'err kt':>8} {'kt~ours':>8}")
    rows = []
    for scheme in want:
        g = OURS[scheme]
        if KT[scheme] == "GPTQ_CLASS":   # the same symmetric GPTQ codes on both sides; float32 on their values
            cg, cu, cd = _gptq_codes(rng, E, I, H, g), _gptq_codes(rng, E, I, H, g), _gptq_codes(rng, E, H, I, g)
            p13 = api.pack_int4(np.concatenate([cg[0], cu[0]], 1), np.concatenate([cg[1], cu[1]], 1), g, scheme=scheme)
            p2 = api.pack_int4(cd[0], cd[1], g, scheme=scheme)
            kts = {n: KtGptq(n, k, cg, cu, cd, max(ms), g) for n in pools}
            w13d, w2d = p13.unpack(), p2.unpack()
            kt_class = gptq_class(load_ext())
        else:
            p13, p2 = api.quantize_experts(w13f, scheme, g), api.quantize_experts(w2f, scheme, g)
            kts = {n: KtMoE(KT[scheme], n, k, gate, up, down, max(ms)) for n in pools}
            kt_class = KT[scheme]
        for M in ms:
            x, tw, calls, ref = inputs[M]
            if KT[scheme] == "GPTQ_CLASS":
                ref = numpy_peer(from_bf16_bits(x), w13d, w2d, tw, calls[0])
            out = np.zeros((M, H), np.uint16)
            ours = from_bf16_bits(api.fused_experts(x, p13, p2, tw, calls[0]))
            theirs = from_bf16_bits(kts[pools[0]](x, calls[0], tw, out))
            fns = [lambda it=itertools.cycle(calls): api.fused_experts(x, p13, p2, tw, next(it))]
            fns += [lambda kt=kt, it=itertools.cycle(calls): kt(x, next(it), tw, out) for kt in kts.values()]
            ts = [[] for _ in fns]
            for _ in range(3):  # rounds of each in turn: the host's swings fall on all
                for t, fn in zip(ts, fns):
                    time.sleep(0.1)  # kt's workers spin some 40 ms after a call: not into the next timing
                    t.append(timed(fn, min_time, 100))
            t_ours, *t_kt = (statistics.median(t) * 1e3 for t in ts)
            r = dict(scheme=scheme, M=M, E=E, kernel=p13.kernel, moe_cpu_ms=t_ours, moe_cpu_threads=threads,
                     kt_version=kv, kt_module=info["module"], kt_class=kt_class,
                     **{f"kt_cpuinfer{n}_ms": t for n, t in zip(pools, t_kt)},
                     rel_err_moe_cpu=_rel(ours, ref), rel_err_kt=_rel(theirs, ref), rel_err_kt_vs_moe_cpu=_rel(theirs, ours))
            r["kt_agrees"] = r["rel_err_kt"] < max(2 * r["rel_err_moe_cpu"], 0.02)  # else kt is driven wrongly
            rows.append(r)
            print(f"{scheme:<10} {M:>5} {t_ours:>9.3f}" + "".join(f"{t:>16.3f}" for t in t_kt)
                  + "".join(f"{t / t_ours:>13.2f}" for t in t_kt)
                  + f" {r['rel_err_moe_cpu']:>9.4f} {r['rel_err_kt']:>8.4f} {r['rel_err_kt_vs_moe_cpu']:>8.4f}"
                  + ("" if r["kt_agrees"] else "  kt's error is far above ours: the peer is driven wrongly?"))
        for kt in kts.values():
            kt.close()
        del p13, p2, kts
    return rows
