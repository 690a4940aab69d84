"""``torch.ops.moe_cpu``: moe_cpu's fused experts and routing as torch custom ops (CPU, zero copy).

Importing this module imports torch and registers the ops (``import moe_cpu`` never does)::

    import moe_cpu.torch_ops as mt
    h13, h2 = mt.register(w13), mt.register(w2)          # PackedExperts -> int handles
    w, ids = torch.ops.moe_cpu.select_experts(logits, 8, renormalize=True)
    y = torch.ops.moe_cpu.fused_experts(x, h13, h2, w, ids)
    torch.ops.moe_cpu.fused_experts_out(x, h13, h2, w, ids, out)   # writes into out

PackedExperts are not tensors, so the ops take them as int handles into a module-level registry:
``register`` keeps a reference until ``release``; the handle is a plain int, so ``torch.compile``
treats it as a constant and the fake (meta) kernels need only the tensors' shapes. Tensors must
be CPU, contiguous and of the documented dtype (float32 or bfloat16 activations, float32 router
weights, int32 / int64 ids); they reach the kernels as NumPy views, and results come back as
tensors over the kernels' arrays (no copies). Inference only: the ops have no autograd formula.
"""
from __future__ import annotations

import itertools
import threading
from typing import Dict, Optional, Tuple

import torch

from . import api
from ._core import PackedExperts
from ._tensors import opt_numpy, to_numpy, to_torch

__all__ = ["register", "release", "lookup"]

_F32, _BF16 = torch.float32, torch.bfloat16
_ACTS = (_F32, _BF16)
_IDS = (torch.int32, torch.int64)

_registry: Dict[int, PackedExperts] = {}
_next_handle = itertools.count(1)
_lock = threading.Lock()


def register(packed: PackedExperts) -> int:
    """A new int handle for ``packed`` (held until :func:`release`), to pass as ``w13`` / ``w2``."""
    if not isinstance(packed, PackedExperts):
        raise TypeError(f"packed must be a moe_cpu.PackedExperts, got {type(packed).__name__}")
    with _lock:
        h = next(_next_handle)
        _registry[h] = packed
    return h


def release(handle: int) -> None:
    """Drop the registry's reference; the handle becomes invalid."""
    with _lock:
        if _registry.pop(handle, None) is None:
            raise ValueError(f"handle {handle!r} is not registered")


def lookup(handle: int, name: str = "handle") -> PackedExperts:
    """The PackedExperts of ``handle``; ValueError naming ``name`` when it is unknown."""
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(f"{name} must be an int handle from moe_cpu.torch_ops.register, got {type(handle).__name__}")
    with _lock:
        p = _registry.get(handle)
    if p is None:
        raise ValueError(f"{name} = {handle} is not a registered handle (moe_cpu.torch_ops.register; released?)")
    return p


def _experts_args(hidden_states, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, expert_map):
    return (to_numpy(hidden_states, "hidden_states", _ACTS), lookup(w13, "w13"), lookup(w2, "w2"),
            to_numpy(topk_weights, "topk_weights", (_F32,)), to_numpy(topk_ids, "topk_ids", _IDS)), dict(
        w13_bias=opt_numpy(w13_bias, "w13_bias", (_F32,)), w2_bias=opt_numpy(w2_bias, "w2_bias", (_F32,)),
        expert_map=opt_numpy(expert_map, "expert_map", (torch.int32,)))


@torch.library.custom_op("moe_cpu::fused_experts", mutates_args=())
def fused_experts(hidden_states: torch.Tensor, w13: int, w2: int, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, activation: str = "silu", apply_router_weight_on_input: bool = False,
                  w13_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
                  expert_map: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``moe_cpu.fused_experts`` on tensors; w13 / w2 are handles from :func:`register`. Returns ``[M, H]``
    of hidden_states' dtype."""
    args, kw = _experts_args(hidden_states, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, expert_map)
    res = api.fused_experts(*args, activation=activation, apply_router_weight_on_input=apply_router_weight_on_input,
                            **kw)
    return to_torch(res, hidden_states.dtype == _BF16)


@fused_experts.register_fake
def _(hidden_states, w13, w2, topk_weights, topk_ids, activation="silu", apply_router_weight_on_input=False,
      w13_bias=None, w2_bias=None, expert_map=None):
    torch._check(hidden_states.dim() == 2, lambda: "hidden_states must be [M, H]")
    return hidden_states.new_empty(hidden_states.shape)


@torch.library.custom_op("moe_cpu::fused_experts_out", mutates_args=("out",))
def fused_experts_out(hidden_states: torch.Tensor, w13: int, w2: int, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, out: torch.Tensor, activation: str = "silu",
                      apply_router_weight_on_input: bool = False, w13_bias: Optional[torch.Tensor] = None,
                      w2_bias: Optional[torch.Tensor] = None, expert_map: Optional[torch.Tensor] = None) -> None:
    """:func:`fused_experts` writing into ``out`` (``[M, H]``, hidden_states' dtype, contiguous)."""
    args, kw = _experts_args(hidden_states, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, expert_map)
    out_np = to_numpy(out, "out", _ACTS)
    if out.dtype != hidden_states.dtype:
        raise TypeError(f"out has dtype {out.dtype} but hidden_states is {hidden_states.dtype}; they must match")
    api.fused_experts(*args, activation=activation, apply_router_weight_on_input=apply_router_weight_on_input,
                      out=out_np, **kw)


@fused_experts_out.register_fake
def _(hidden_states, w13, w2, topk_weights, topk_ids, out, activation="silu", apply_router_weight_on_input=False,
      w13_bias=None, w2_bias=None, expert_map=None):
    return None


@torch.library.custom_op("moe_cpu::select_experts", mutates_args=())
def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool = False,
                   scoring_func: str = "softmax", use_grouped_topk: bool = False,
                   num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
                   e_score_correction_bias: Optional[torch.Tensor] = None,
                   routed_scaling_factor: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """``moe_cpu.select_experts`` on float32 ``[M, E]`` logits -> (float32 ``[M, k]``, int32 ``[M, k]``)."""
    w, ids = api.select_experts(
        to_numpy(router_logits, "router_logits", (_F32,)), top_k, renormalize=renormalize,
        scoring_func=scoring_func, use_grouped_topk=use_grouped_topk, num_expert_group=num_expert_group,
        topk_group=topk_group, routed_scaling_factor=routed_scaling_factor,
        e_score_correction_bias=opt_numpy(e_score_correction_bias, "e_score_correction_bias", (_F32,)))
    return torch.from_numpy(w), torch.from_numpy(ids)


@select_experts.register_fake
def _(router_logits, top_k, renormalize=False, scoring_func="softmax", use_grouped_topk=False,
      num_expert_group=None, topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0):
    torch._check(router_logits.dim() == 2, lambda: "router_logits must be [M, E]")
    M = router_logits.shape[0]
    return (router_logits.new_empty((M, top_k), dtype=torch.float32),
            router_logits.new_empty((M, top_k), dtype=torch.int32))
