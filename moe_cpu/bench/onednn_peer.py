"""oneDNN through torch as a bench peer (torch is never a runtime dependency): the expert GEMMs of moe_cpu's bf16
and int8_w8a8 (per channel) schemes on the same weights and the same routing, in the same run.

- bf16: per expert, ``F.linear`` on bf16 weights and activations (torch sends bf16 matmuls to oneDNN, on AMX where
  the CPU has it), SiLU and mul, ``F.linear``, the router weight, ``index_add_``;
- int8: per expert, ``torch.ao.nn.quantized.dynamic.Linear`` (per-channel int8 weights: moe_cpu's codes, its scales
  within an ulp; activations quantized per call) under each quantized engine torch has of ``onednn`` and ``x86``.

Errors are against float64 of the same (dequantized) weights; times are medians of calls alternated with moe_cpu's.
``moe-cpu bench --onednn-peer`` runs it (Qwen3 shape, ``--m``, default 128,1024).
"""
from __future__ import annotations

import warnings

import numpy as np

from .. import api
from ..reference import fused_experts_float64
from .peers import import_torch
from .random_forms import random_packed
from .shapes import SHAPES
from .timing import timed

ENGINES = ("onednn", "x86")


def _rel(got, want) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / max(np.linalg.norm(want), 1e-30))


def onednn_peer(rng, threads, ms=(128, 1024), experts=None, min_time=0.4):
    """Rows of (scheme, M, peer): moe_cpu's and the peer's ms per call and errors; [] where torch is missing."""
    torch = import_torch("oneDNN peer", threads)
    if torch is None:
        return []
    H, I, _, k, E, _ = SHAPES["qwen3-30b-a3b"]
    E = experts or E
    F = torch.nn.functional
    engines = [e for e in ENGINES if e in torch.backends.quantized.supported_engines]
    print(f"\noneDNN peer through torch {torch.__version__} (qwen3-30b-a3b shape, {E} experts, {threads} threads; "
          f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}, mkldnn "
          f"{'on' if torch.backends.mkldnn.is_available() else 'off'}): ms per call, error against float64")
    print(f"{'scheme':<10} {'M':>5} {'peer':<26} {'moe_cpu ms':>10} {'peer ms':>9} {'peer/mc':>8} {'mc err':>9} {'peer err':>9}")

    def loop(x, ids, tw, lin13, lin2):
        out = torch.zeros(x.shape[0], H, dtype=x.dtype)
        for e in torch.unique(ids).tolist():
            rows, cols = torch.nonzero(ids == e, as_tuple=True)
            y = lin13(e, x[rows])
            out.index_add_(0, rows, lin2(e, F.silu(y[:, :I]) * y[:, I:]) * tw[rows, cols, None])
        return out

    out_rows = []
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's notes on its quantized tensor API
        for scheme in ("bf16", "int8_w8a8"):
            w13, w2 = random_packed(rng, scheme, E, 2 * I, H), random_packed(rng, scheme, E, H, I)
            f13, f2 = w13.unpack(), w2.unpack()
            peers = {}
            if scheme == "bf16":
                b13, b2 = torch.from_numpy(f13).to(torch.bfloat16), torch.from_numpy(f2).to(torch.bfloat16)
                peers["F.linear bf16"] = (torch.bfloat16, lambda e, a: F.linear(a, b13[e]), lambda e, a: F.linear(a, b2[e]))
            else:
                for eng in engines:
                    torch.backends.quantized.engine = eng
                    mods = []
                    for f in (f13, f2):
                        ms_ = []
                        for e in range(E):
                            w = torch.from_numpy(f[e])
                            s = (w.abs().amax(1) / 127).clamp_min(1e-30).double()
                            q = torch.quantize_per_channel(w, s, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
                            m = torch.ao.nn.quantized.dynamic.Linear(w.shape[1], w.shape[0], bias_=False, dtype=torch.qint8)
                            m.set_weight_bias(q, None)
                            ms_.append(m)
                        mods.append(ms_)
                    m13, m2 = mods
                    peers[f"dynamic int8 Linear, {eng}"] = (torch.float32, lambda e, a, m=m13: m[e](a),
                                                           lambda e, a, m=m2: m[e](a), eng)
            for M in ms:
                x = rng.standard_normal((M, H), dtype=np.float32)
                tw = np.full((M, k), 1.0 / k, np.float32)
                ids = np.ascontiguousarray(np.argsort(rng.random((M, E)), axis=1)[:, :k], dtype=np.int32)
                c = min(M, 32)  # errors on the first tokens (float64 of every token would outlast the timing)
                want = fused_experts_float64(x[:c], f13, f2, tw[:c], ids[:c])
                mc_err = _rel(api.fused_experts(x[:c], w13, w2, tw[:c], ids[:c]), want)
                t_mc = timed(lambda: api.fused_experts(x, w13, w2, tw, ids), min_time)
                for name, spec in peers.items():
                    dt, lin13, lin2 = spec[:3]
                    if len(spec) > 3:
                        torch.backends.quantized.engine = spec[3]
                    xt, twt, idt = torch.from_numpy(x).to(dt), torch.from_numpy(tw).to(dt), torch.from_numpy(ids).long()
                    peer_err = _rel(loop(xt[:c], idt[:c], twt[:c], lin13, lin2).float().numpy(), want)
                    t_peer = timed(lambda: loop(xt, idt, twt, lin13, lin2), min_time, 10)
                    r = dict(scheme=scheme, M=M, peer=name, experts=E, kernel=w13.kernel, moe_cpu_ms=t_mc * 1e3,
                             peer_ms=t_peer * 1e3, rel_err_moe_cpu=mc_err, rel_err_peer=peer_err, torch_version=torch.__version__)
                    out_rows.append(r)
                    print(f"{scheme:<10} {M:>5} {name:<26} {t_mc * 1e3:>10.2f} {t_peer * 1e3:>9.2f} "
                          f"{t_peer / t_mc:>8.2f} {mc_err:>9.2e} {peer_err:>9.2e}")
            del w13, w2, f13, f2, peers
    return out_rows
