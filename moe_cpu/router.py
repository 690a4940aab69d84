"""The router of a MoE layer and the shared expert's gate, composed by ``MoELayer`` and
``distributed.EPMoELayer`` (the same operations, so the same bits on every rank)::

    logits  = x @ gate.T (+ gate_bias)            float32 (bf16 inputs widened), one summation order for every
                                                  M, thread count and ISA (batch-invariant; _core.router_logits)
    w, ids  = select_experts(logits, top_k, ...)  weights include routed_scaling_factor
    g       = sigmoid(x @ shared_expert_gate)     Qwen2-MoE's per-token shared-expert weight
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from . import _core, api
from ._dtypes import from_bf16_bits, to_bf16_bits

__all__ = ["Router"]

_SCORING = ("softmax", "sigmoid")


def check_int(v: object, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return int(v)


def check_f32(a: object, name: str, shape: Tuple[int, ...]) -> Optional[np.ndarray]:
    """None, or a C-contiguous, finite float32 array of exactly `shape` (a layer parameter)."""
    if a is None:
        return None
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy float32 array, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} has shape {list(a.shape)} but {list(shape)} was expected")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        i = np.unravel_index(int(bad[0]), a.shape)
        raise ValueError(f"{name}[{', '.join(map(str, i))}] = {a[i]} is not finite")
    return a


def widen(x: np.ndarray) -> np.ndarray:
    """float32 as is; bf16 (ml_dtypes.bfloat16 or uint16 bits) -> float32 values (exact)."""
    if x.dtype == np.float32:
        return x
    return from_bf16_bits(x)


def round_like(out32: np.ndarray, x: np.ndarray) -> np.ndarray:
    """An fp32 result in x's dtype (bf16: rounded to nearest even once, as x's kind of bf16)."""
    if x.dtype == np.float32:
        return out32
    bits = to_bf16_bits(out32)
    return bits if x.dtype == np.uint16 else bits.view(x.dtype)


class Router:
    """Router weight, routing settings and the optional shared-expert gate of one layer (checked here).

    Args:
        gate: float32 ``[E, H]``. gate_bias: optional float32 ``[E]`` added to the logits (gpt-oss).
        top_k, renormalize, scoring_func, use_grouped_topk, num_expert_group, topk_group,
        e_score_correction_bias (float32 ``[E]``), routed_scaling_factor: as in ``moe_cpu.select_experts``.
        shared_expert_gate: optional float32 ``[H]`` (Qwen2-MoE).
    """

    def __init__(self, gate: np.ndarray, *, top_k: int, gate_bias: Optional[np.ndarray] = None,
                 renormalize: bool = False, scoring_func: str = "softmax", use_grouped_topk: bool = False,
                 num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
                 e_score_correction_bias: Optional[np.ndarray] = None, routed_scaling_factor: float = 1.0,
                 shared_expert_gate: Optional[np.ndarray] = None) -> None:
        if not isinstance(gate, np.ndarray) or gate.ndim != 2:
            raise TypeError(f"gate must be a numpy float32 array [E, H], got {getattr(gate, 'shape', type(gate).__name__)}")
        E, H = gate.shape
        self.gate = check_f32(gate, "gate", (E, H))
        self.gate_bias = check_f32(gate_bias, "gate_bias", (E,))
        self.shared_expert_gate = check_f32(shared_expert_gate, "shared_expert_gate", (H,))
        self.top_k = check_int(top_k, "top_k")
        if not 1 <= self.top_k <= E:
            raise ValueError(f"top_k = {self.top_k} must be in [1, E={E}]")
        self.renormalize = bool(renormalize)
        if scoring_func not in _SCORING:
            raise ValueError(f"scoring_func = {scoring_func!r} must be one of {_SCORING}")
        self.scoring_func = scoring_func
        self.use_grouped_topk = bool(use_grouped_topk)
        if self.use_grouped_topk:
            if num_expert_group is None or topk_group is None:
                raise ValueError("use_grouped_topk=True needs num_expert_group and topk_group")
            G, T = check_int(num_expert_group, "num_expert_group"), check_int(topk_group, "topk_group")
            if G < 1 or E % G:
                raise ValueError(f"num_expert_group = {G} must be positive and divide E = {E}")
            if not 1 <= T <= G:
                raise ValueError(f"topk_group = {T} must be in [1, num_expert_group={G}]")
            if self.top_k > T * (E // G):
                raise ValueError(f"top_k = {self.top_k} exceeds the {T * (E // G)} experts of topk_group={T} "
                                 f"groups of {E // G}")
            num_expert_group, topk_group = G, T
        elif num_expert_group is not None or topk_group is not None:
            raise ValueError("num_expert_group / topk_group are given but use_grouped_topk=False")
        self.num_expert_group, self.topk_group = num_expert_group, topk_group
        self.e_score_correction_bias = check_f32(e_score_correction_bias, "e_score_correction_bias", (E,))
        if (self.use_grouped_topk and self.e_score_correction_bias is not None
                and E // self.num_expert_group < 2):
            raise ValueError("e_score_correction_bias with grouped routing needs >= 2 experts per group")
        if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float, np.number)):
            raise TypeError(f"routed_scaling_factor must be a number, got {type(routed_scaling_factor).__name__}")
        if not math.isfinite(float(routed_scaling_factor)):
            raise ValueError(f"routed_scaling_factor = {routed_scaling_factor} must be finite")
        self.routed_scaling_factor = float(routed_scaling_factor)

    @property
    def num_experts(self) -> int:
        return self.gate.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.gate.shape[1]

    def routing_kwargs(self) -> dict:
        """The keyword arguments of ``select_experts`` (and of ``Router``) that set the routing."""
        return dict(renormalize=self.renormalize, scoring_func=self.scoring_func,
                    use_grouped_topk=self.use_grouped_topk, num_expert_group=self.num_expert_group,
                    topk_group=self.topk_group, e_score_correction_bias=self.e_score_correction_bias,
                    routed_scaling_factor=self.routed_scaling_factor)

    def check_x(self, x: object) -> np.ndarray:
        """x as given when it is a C-contiguous float32 / bf16 ``[M, H]`` array; TypeError / ValueError else."""
        H = self.hidden_size
        if not isinstance(x, np.ndarray):
            raise TypeError(f"x must be a numpy array [M, H], got {type(x).__name__}")
        if not (x.dtype == np.float32 or x.dtype == np.uint16 or x.dtype.name == "bfloat16"):
            raise TypeError(f"x must be float32 or bfloat16 (ml_dtypes or uint16 bits), got {x.dtype}")
        if x.ndim != 2 or x.shape[1] != H:
            raise ValueError(f"x has shape {list(x.shape)} but [M, H={H}] was expected")
        if not x.flags.c_contiguous:
            raise ValueError("x must be C-contiguous (use np.ascontiguousarray)")
        return x

    def logits(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[M, E]`` = x @ gate.T (+ gate_bias), x checked and widened to float32."""
        return _core.router_logits(api._bf16_bits(self.check_x(x)), self.gate, self.gate_bias)

    def route(self, x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(topk_weights float32 [M, k], topk_ids int32 [M, k])``; the weights include routed_scaling_factor."""
        return api.select_experts(self.logits(x), self.top_k, **self.routing_kwargs())

    def shared_gate(self, x: np.ndarray) -> np.ndarray:
        """float32 ``[M]``: sigmoid(x @ shared_expert_gate), x widened to float32."""
        if self.shared_expert_gate is None:
            raise ValueError("this layer has no shared_expert_gate")
        return _core.shared_gate(api._bf16_bits(self.check_x(x)), self.shared_expert_gate)

    def describe(self) -> str:
        """One line: 'grouped sigmoid top-8, 4 of 8 groups, correction bias, renormalized, scale 2.5'."""
        parts = [f"{'grouped ' if self.use_grouped_topk else ''}{self.scoring_func} top-{self.top_k}"]
        if self.use_grouped_topk:
            parts.append(f"{self.topk_group} of {self.num_expert_group} groups")
        if self.e_score_correction_bias is not None:
            parts.append("correction bias")
        if self.renormalize:
            parts.append("renormalized")
        if self.routed_scaling_factor != 1.0:
            parts.append(f"scale {self.routed_scaling_factor:g}")
        return ", ".join(parts)
