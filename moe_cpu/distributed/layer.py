"""EPMoELayer: one MoE layer whose routed experts are split over the ranks of an MPI communicator.

Every rank holds the router (gate [E, H], small) and only its own experts. A call is collective:

    logits, weights, ids  = router(x)                       every rank, same x -> same routing
    partial               = fused_experts(x, own experts, expert_map)   ids of other ranks -> -1, skipped
    partial              += shared expert (rank 0 only; times sigmoid(x @ shared_expert_gate) if gated)
    agree                 = Allreduce(MAX) of [failed, M, -M, crc, -crc]  (int64, 40 bytes)
    out                   = Allreduce(SUM) of partial (fp32 [M, H]), rounded once to x's dtype

The sum over ranks reassociates the fp32 top-k sum (rel. error ~1e-7); with ``exact=True`` each rank
returns its per-slot outputs ([M*k, H], others zero), the all-reduce gathers them and every rank sums
slots j = 0..k-1 in the single-process order: bit-identical to ``MoELayer``, at k times the traffic.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

import numpy as np

from .. import api, reference
from .._core import PackedExperts
from ..layer import MoELayer, quantize_shared
from ..router import Router, round_like, widen
from ._mpi import agree, check_comm, digest, mpi
from .placement import Placement, check_placement, expert_map
from .take import take_experts
from .threads import place_threads

__all__ = ["EPMoELayer"]

_ROUTER_ARGS = ("top_k", "gate_bias", "renormalize", "scoring_func", "use_grouped_topk", "num_expert_group",
                "topk_group", "e_score_correction_bias", "routed_scaling_factor", "shared_expert_gate")


def _rows(a: Optional[np.ndarray], ids: Sequence[int]) -> Optional[np.ndarray]:
    return None if a is None else np.ascontiguousarray(a[list(ids)])


class EPMoELayer:
    """Expert-parallel MoE layer over an mpi4py communicator (build it with a ``from_*`` method;
    they are collective, and a failure on one rank raises on all).

    Args:
        comm: mpi4py intracommunicator; every rank constructs the layer and calls it together.
        placement: the result of ``check_placement`` (placement[r] = ids held by rank r).
        router: the layer's ``moe_cpu.router.Router`` (gate, routing settings, shared-expert gate).
        w13, w2: this rank's experts ``[len(placement[rank]), ...]`` (None when it holds none).
        activation: one of ``moe_cpu.ACTIVATIONS``.
        w13_bias, w2_bias: this rank's rows of the expert biases.
        shared_w13, shared_w2: the shared expert, held by the ranks that run it (rank 0; all with exact).
        exact: bit-identical to the single-process layer (per-slot all-reduce, k times the bytes).
        threads: "auto" (``place_threads``: ranks on one host share its cores), an int, or None (leave);
            the ``from_*`` constructors apply it once every rank has built its part.
    """

    def __init__(self, comm: Any, placement: Placement, router: Router, w13: Optional[PackedExperts],
                 w2: Optional[PackedExperts], *, activation: str = "silu", w13_bias: Optional[np.ndarray] = None,
                 w2_bias: Optional[np.ndarray] = None, shared_w13: Optional[PackedExperts] = None,
                 shared_w2: Optional[PackedExperts] = None, exact: bool = False, threads: object = "auto") -> None:
        if not isinstance(router, Router):
            raise TypeError(f"router must be a moe_cpu.router.Router, got {type(router).__name__}")
        if activation not in api.ACTIVATIONS:
            raise ValueError(f"activation = {activation!r} must be one of {api.ACTIVATIONS}")
        if router.shared_expert_gate is not None and shared_w13 is None:
            raise ValueError("shared_expert_gate is given but the layer has no shared expert (shared_w13 / shared_w2)")
        self.comm = check_comm(comm)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.placement, self.router, self.activation, self.exact = placement, router, activation, bool(exact)
        self.experts = placement[self.rank]
        self.num_experts = router.num_experts
        self.expert_map = expert_map(self.experts, self.num_experts)
        self.w13, self.w2, self.w13_bias, self.w2_bias = w13, w2, w13_bias, w2_bias
        runs_shared = self.exact or self.rank == 0
        self.shared_w13, self.shared_w2 = (shared_w13, shared_w2) if runs_shared else (None, None)
        self.has_shared_expert = self.shared_w13 is not None   # runs it here
        self.last_times = (0.0, 0.0, 0.0)
        self.threads = threads   # applied by _build once every rank has built (place_threads is collective)

    # ------------------------------------------------------------------ construction
    @classmethod
    def _build(cls, comm: Any, placement: object, E: int, make: Any, **opts: Any) -> "EPMoELayer":
        """Check comm and placement, then ``make(own ids)`` -> EPMoELayer, with every rank agreeing on
        success (a rank that fails raises, the others raise RemoteRankError: nobody hangs)."""
        comm = check_comm(comm)
        layer, exc = None, None
        try:
            pl = check_placement(placement, E, comm.Get_size())
            layer = make(pl, **opts)
        except Exception as e:   # noqa: BLE001 - re-raised on this rank by agree()
            exc = e
        agree(comm, exc, "EPMoELayer construction", num_experts=E, placement=digest(
            np.array([e for ids in (layer.placement if layer else ()) for e in ids + (-1,)], np.int64)))
        if layer.threads == "auto":
            place_threads(comm)
        elif layer.threads is not None:
            api.set_num_threads(layer.threads)
        return layer

    @classmethod
    def from_layer(cls, layer: MoELayer, comm: Any, placement: object = None, *, exact: bool = False,
                   threads: object = "auto") -> "EPMoELayer":
        """Split a full ``MoELayer`` (e.g. ``MoELayer.load`` of a converted directory, mapped without
        a copy): each rank re-packs its own experts. Needs the whole layer on every rank while it
        runs; ``from_pretrained`` / ``from_float`` read only the rank's share."""
        if not isinstance(layer, MoELayer):
            raise TypeError(f"layer must be a moe_cpu.MoELayer, got {type(layer).__name__}")

        def make(pl: Placement) -> "EPMoELayer":
            own = pl[comm.Get_rank()]
            return cls(comm, pl, layer.router, take_experts(layer.w13, own), take_experts(layer.w2, own),
                       activation=layer.activation, w13_bias=_rows(layer.w13_bias, own), w2_bias=_rows(layer.w2_bias, own),
                       shared_w13=layer.shared_w13, shared_w2=layer.shared_w2, exact=exact, threads=threads)
        return cls._build(comm, placement, layer.num_experts, make)

    @classmethod
    def from_float(cls, gate: np.ndarray, w13: np.ndarray, w2: np.ndarray, *, comm: Any, placement: object = None,
                   exact: bool = False, threads: object = "auto", **kw: Any) -> "EPMoELayer":
        """``MoELayer.from_float`` arguments; each rank quantizes only its own experts (per-expert
        quantization, so each is bit-identical to the single-process layer's)."""
        if not isinstance(gate, np.ndarray) or gate.ndim != 2:
            raise ValueError(f"gate must be a float32 [E, H] array, got {getattr(gate, 'shape', type(gate).__name__)}")

        def make(pl: Placement) -> "EPMoELayer":
            own = list(pl[comm.Get_rank()])
            if not isinstance(w13, np.ndarray) or not isinstance(w2, np.ndarray) or w13.ndim != 3 or w2.ndim != 3:
                raise ValueError("w13 and w2 must be float32 [E, 2I, H] and [E, H, I] arrays")
            if (w13.shape[0], w2.shape[0]) != (gate.shape[0],) * 2:
                raise ValueError(f"gate has {gate.shape[0]} experts but w13 {w13.shape[0]} and w2 {w2.shape[0]}")
            r = Router(gate, **{k: kw[k] for k in _ROUTER_ARGS if k in kw})
            q = dict(scheme=kw.get("scheme", "int4_w4a8"), group_size=kw.get("group_size"),
                     block_size=kw.get("block_size", (128, 128)))
            s13, s2 = quantize_shared(kw.get("shared_w13"), kw.get("shared_w2"), **q)
            p13 = api.quantize_experts(np.ascontiguousarray(w13[own]), **q) if own else None
            p2 = api.quantize_experts(np.ascontiguousarray(w2[own]), **q) if own else None
            return cls(comm, pl, r, p13, p2, activation=kw.get("activation", "silu"),
                       w13_bias=_rows(kw.get("w13_bias"), own), w2_bias=_rows(kw.get("w2_bias"), own),
                       shared_w13=s13, shared_w2=s2, exact=exact, threads=threads)
        return cls._build(comm, placement, gate.shape[0], make)

    @classmethod
    def from_pretrained(cls, path: "str | os.PathLike[str]", layer_idx: int, scheme: Optional[str] = None, *,
                        comm: Any, placement: object = None, exact: bool = False, threads: object = "auto",
                        **loader_kwargs: Any) -> "EPMoELayer":
        """Layer ``layer_idx`` of a checkpoint; each rank reads and packs only its own experts
        (``load_layer(..., experts=...)``), so its memory is about 1/ranks of the layer."""
        from ..loaders import load_layer, num_experts

        E = num_experts(path, layer_idx)

        def make(pl: Placement) -> "EPMoELayer":
            own = pl[comm.Get_rank()]
            lw = load_layer(path, layer_idx, scheme, experts=own, **loader_kwargs)
            c = lw.config
            r = Router(lw.gate, top_k=c.top_k, gate_bias=lw.gate_bias, shared_expert_gate=lw.shared_expert_gate,
                       e_score_correction_bias=lw.e_score_correction_bias, **c.routing_kwargs())
            return cls(comm, pl, r, lw.w13, lw.w2, activation=c.activation, w13_bias=lw.w13_bias, w2_bias=lw.w2_bias,
                       shared_w13=lw.shared_w13, shared_w2=lw.shared_w2, exact=exact, threads=threads)
        return cls._build(comm, placement, E, make)

    # ------------------------------------------------------------------ shapes
    @property
    def hidden_size(self) -> int:
        return self.router.hidden_size

    @property
    def top_k(self) -> int:
        return self.router.top_k

    @property
    def nbytes(self) -> int:
        """Packed weight bytes held by THIS rank (its routed experts plus the shared expert if it runs it)."""
        n = sum(w.nbytes for w in (self.w13, self.w2, self.shared_w13, self.shared_w2) if w is not None)
        return n

    # ------------------------------------------------------------------ forward
    def _partial(self, x: np.ndarray, weights: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """fp32 [M, H]: this rank's experts (+ the shared expert on rank 0); [M*k, H] per slot when exact."""
        xf = widen(x)
        if self.exact:
            k = ids.shape[1]
            xf, weights, ids = np.repeat(xf, k, axis=0), weights.reshape(-1, 1), ids.reshape(-1, 1)
        if self.w13 is None or xf.shape[0] == 0:
            part = np.zeros((xf.shape[0], self.hidden_size), np.float32)
        else:
            part = api.fused_experts(xf, self.w13, self.w2, weights, ids, activation=self.activation,
                                     w13_bias=self.w13_bias, w2_bias=self.w2_bias, expert_map=self.expert_map)
        if self.has_shared_expert and not self.exact and part.shape[0]:
            part = self._add_shared(x, xf, part)
        return part

    def _add_shared(self, x: np.ndarray, xf: np.ndarray, acc: np.ndarray) -> np.ndarray:
        """acc (fp32) += the shared expert of xf, times Qwen2-MoE's sigmoid gate when the layer has one
        (as MoELayer: a one-expert fused_experts whose top-k weight is the gate)."""
        if self.router.shared_expert_gate is None:
            return api.shared_expert(xf, self.shared_w13, self.shared_w2, acc, 1.0, inplace=True)
        M = xf.shape[0]
        acc += api.fused_experts(xf, self.shared_w13, self.shared_w2, self.router.shared_gate(x)[:, None],
                                 np.zeros((M, 1), np.int32))
        return acc

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Collective: every rank passes the same x [M, H] (float32 or bf16) and gets the whole output."""
        MPI = mpi()
        exc, M, crc, part = None, -1, 0, None
        t0 = time.perf_counter()
        try:
            x = self.router.check_x(x)
            M = x.shape[0]
            weights, ids = self.router.route(x)
            crc = digest(weights, ids)
            part = self._partial(x, weights, ids)
        except Exception as e:   # noqa: BLE001 - re-raised here by agree(), reported on the other ranks
            exc = e
        t1 = time.perf_counter()
        agree(self.comm, exc, "EPMoELayer call", M=M, routing=crc)
        t2 = time.perf_counter()
        self.comm.Allreduce(MPI.IN_PLACE, part, op=MPI.SUM)
        self.last_times = (t1 - t0, t2 - t1, time.perf_counter() - t2)   # compute, agree, all-reduce (s)
        if self.exact:
            part = self._sum_slots(part, M)
            if self.has_shared_expert and M and self.router.shared_expert_gate is not None:
                return round_like(self._add_shared(x, widen(x), part), x)   # MoELayer: fp32 sum, one rounding
            out = round_like(part, x)
            if self.has_shared_expert and M:
                out = api.shared_expert(x, self.shared_w13, self.shared_w2, out, 1.0, inplace=True)
            return out
        return round_like(part, x)

    def _sum_slots(self, slots: np.ndarray, M: int) -> np.ndarray:
        """[M*k, H] -> [M, H]: the top-k sum in fp32, j = 0..k-1 in order (fused_experts' order)."""
        s = slots.reshape(M, self.top_k, self.hidden_size)
        acc = s[:, 0].copy()
        for j in range(1, self.top_k):
            acc += s[:, j]
        return acc

    def reference(self, x: np.ndarray) -> np.ndarray:
        """Collective: float64 [M, H] of the whole layer (``MoELayer.reference``): each rank computes
        its experts with ``moe_cpu.reference`` and the float64 partials are summed."""
        MPI = mpi()
        exc, M, part = None, -1, None
        try:
            x = self.router.check_x(x)
            M = x.shape[0]
            w, ids = reference.select_experts_ref(self.router.logits(x), self.top_k, **self.router.routing_kwargs())
            part = np.zeros((M, self.hidden_size), np.float64)
            if self.w13 is not None and M:
                local = np.where(ids >= 0, self.expert_map[np.maximum(ids, 0)], -1).astype(np.int32)
                part += reference.fused_experts_float64(x, self.w13.unpack(), self.w2.unpack(), w, local,
                                                        activation=self.activation,
                                                        w13_bias=self.w13_bias, w2_bias=self.w2_bias)
            if self.rank == 0 and self.shared_w13 is not None and M:
                g = (np.ones((M, 1), np.float32) if self.router.shared_expert_gate is None
                     else self.router.shared_gate(x)[:, None])
                part += reference.fused_experts_float64(x, self.shared_w13.unpack(), self.shared_w2.unpack(),
                                                        g, np.zeros((M, 1), np.int32))
        except Exception as e:   # noqa: BLE001
            exc = e
        agree(self.comm, exc, "EPMoELayer.reference", M=M)
        self.comm.Allreduce(MPI.IN_PLACE, part, op=MPI.SUM)
        return part

    def __repr__(self) -> str:
        sizes = [len(p) for p in self.placement]
        return (f"EPMoELayer(E={self.num_experts}, H={self.hidden_size}, top_k={self.top_k}, ranks={self.size}, "
                f"experts per rank {sizes}, rank {self.rank} holds {len(self.experts)}, "
                f"{self.nbytes / 2**20:.1f} MiB here{', exact' if self.exact else ''})")
