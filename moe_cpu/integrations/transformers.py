"""Run a loaded transformers MoE model's sparse MoE blocks on moe_cpu: ``patch(model, scheme)``.

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    names = moe_cpu.integrations.transformers.patch(model, "int4_w4a8", group_size=64)
    model.generate(...)                       # the MoE blocks now run moe_cpu kernels

Blocks replaced (transformers 5, matched by exact class): Qwen3MoeSparseMoeBlock,
Qwen2MoeSparseMoeBlock, MixtralSparseMoeBlock, DeepseekV3MoE, GptOssMLP. Each becomes a
:class:`MoECPUBlock` holding a ``moe_cpu.MoELayer`` built from the block's weights (quantized to
``scheme`` at patch time) and returning what the block returned (gpt-oss: ``(hidden, router_scores)``).
Inference only; the original expert weights are released. Imports torch and transformers.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .. import api
from .._tensors import to_numpy, to_torch
from ..layer import MoELayer
from ..loaders.config import _HF_ACT

__all__ = ["patch", "MoECPUBlock", "SUPPORTED_BLOCKS"]

_M = "transformers.models."
# (module, class) -> family
SUPPORTED_BLOCKS = {
    (_M + "qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock"): "qwen3_moe",
    (_M + "qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock"): "qwen2_moe",
    (_M + "mixtral.modeling_mixtral", "MixtralSparseMoeBlock"): "mixtral",
    (_M + "deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE"): "deepseek_v3",
    (_M + "gpt_oss.modeling_gpt_oss", "GptOssMLP"): "gpt_oss",
}
ROUTINGS = ("model", "moe_cpu")
_ACT_DTYPES = (torch.float32, torch.bfloat16)


def _family(module: torch.nn.Module) -> Optional[str]:
    t = type(module)
    return SUPPORTED_BLOCKS.get((t.__module__, t.__qualname__))


def _f32(t: torch.Tensor) -> np.ndarray:
    """A float32 NumPy copy of a (small) parameter: router weights, biases."""
    return np.array(t.detach().to(torch.float32).cpu().numpy(), dtype=np.float32, copy=True)


def _spec(block: torch.nn.Module, family: str, config: Any) -> Dict[str, Any]:
    """The block's weights (torch, un-copied) and MoELayer settings; raises on what moe_cpu cannot run."""
    ex = block.experts
    router_name = "router" if family == "gpt_oss" else "gate"
    r = getattr(block, router_name)
    s: Dict[str, Any] = dict(router_name=router_name, top_k=int(r.top_k), gate=_f32(r.weight))
    if family == "gpt_oss":
        if float(ex.alpha) != 1.702 or float(ex.limit) != 7.0:
            raise ValueError(f"gpt_oss swiglu_alpha = {ex.alpha}, swiglu_limit = {ex.limit}: moe_cpu's swigluoai "
                             "uses 1.702 and 7")
        s.update(w13=ex.gate_up_proj.transpose(1, 2), w2=ex.down_proj.transpose(1, 2), activation="swigluoai",
                 renormalize=True, gate_bias=_f32(r.bias), w13_bias=_f32(ex.gate_up_proj_bias),
                 w2_bias=_f32(ex.down_proj_bias))
    else:
        act = getattr(config, "hidden_act", "silu")
        if _HF_ACT.get(act) != "silu":
            raise ValueError(f"{family}: hidden_act = {act!r} is not supported by the patch (SiLU experts only)")
        s.update(w13=ex.gate_up_proj, w2=ex.down_proj, activation="silu",
                 renormalize=family == "mixtral" or bool(r.norm_topk_prob))
    shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
    if shared is not None:
        s["shared_w13"] = torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
        s["shared_w2"] = shared.down_proj.weight
    if family == "qwen2_moe":
        s["shared_expert_gate"] = _f32(block.shared_expert_gate.weight).reshape(-1)
    if family == "deepseek_v3":
        s.update(renormalize=bool(r.norm_topk_prob), scoring_func="sigmoid", use_grouped_topk=True,
                 num_expert_group=int(r.num_group), topk_group=int(r.topk_group),
                 routed_scaling_factor=float(r.routed_scaling_factor),
                 e_score_correction_bias=_f32(r.e_score_correction_bias))
    for name in ("w13", "w2"):
        t = s[name]
        if t.device.type != "cpu" or t.dtype not in _ACT_DTYPES:
            raise TypeError(f"{family} experts.{name}: {t.dtype} on {t.device}; the patch needs float32 or bfloat16 "
                            "weights on the CPU (load the model with dtype=torch.bfloat16)")
    return s


def _pack(t: torch.Tensor, scheme: str, group_size: Optional[int], name: str) -> api.PackedExperts:
    """[E, N, K] (or [N, K]) weights -> PackedExperts: bf16 weights into "bf16" as they are, else quantized."""
    t = t.detach()
    t = t[None] if t.dim() == 2 else t
    try:
        if scheme == "bf16" and t.dtype == torch.bfloat16 and group_size is None:
            return api.pack_bf16(to_numpy(t.contiguous(), name, (torch.bfloat16,)))
        return api.quantize_experts(t.to(torch.float32).contiguous().numpy(), scheme, group_size)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from None


class MoECPUBlock(torch.nn.Module):
    """A transformers sparse MoE block running on a ``moe_cpu.MoELayer`` (``self.layer``).

    ``routing="model"``: the block's own router module is kept (as ``gate`` / ``router``) and picks
    the experts, exactly as before the patch (output_router_logits still records it); ``"moe_cpu"``:
    the layer routes in float32 NumPy (``MoELayer.route``) and no router module remains.
    """

    def __init__(self, layer: MoELayer, family: str, router: Optional[torch.nn.Module] = None,
                 router_name: str = "gate") -> None:
        super().__init__()
        self.layer, self.family, self._router_name = layer, family, router_name if router is not None else None
        if router is not None:
            self.add_module(router_name, router)

    @classmethod
    def from_block(cls, block: torch.nn.Module, config: Any, scheme: Optional[str] = None, *,
                   group_size: Optional[int] = None, routing: str = "model") -> "MoECPUBlock":
        """Build from one supported block; ``config`` is the model's (text) config; scheme None = "bf16"."""
        family = _family(block)
        if family is None:
            raise TypeError(f"{type(block).__qualname__} is not a supported MoE block "
                            f"({', '.join(c for _, c in SUPPORTED_BLOCKS)})")
        if routing not in ROUTINGS:
            raise ValueError(f"routing = {routing!r} must be one of {ROUTINGS}")
        s = _spec(block, family, config)
        return cls._build(block, family, s, scheme or "bf16", group_size, routing)

    @classmethod
    def _build(cls, block, family, s, scheme, group_size, routing) -> "MoECPUBlock":
        if scheme not in api.SCHEMES:
            raise ValueError(f"scheme = {scheme!r} must be one of {api.SCHEMES} (or None for bf16)")
        packed = {k: _pack(s.pop(k), scheme, group_size, f"{family} {k}")
                  for k in ("w13", "w2", "shared_w13", "shared_w2") if k in s}
        router_name = s.pop("router_name")
        layer = MoELayer(s.pop("gate"), packed.pop("w13"), packed.pop("w2"), **packed, **s)
        router = getattr(block, router_name) if routing == "model" else None
        return cls(layer, family, router, router_name)

    def forward(self, hidden_states: torch.Tensor) -> Any:
        if self.training and torch.is_grad_enabled():
            raise RuntimeError("a moe_cpu-patched MoE block is inference-only "
                               "(call model.eval() or use torch.no_grad())")
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        xn = to_numpy(x, "hidden_states", _ACT_DTYPES)
        if self._router_name is not None:
            _, scores, ids = getattr(self, self._router_name)(x)
            w = scores.to(torch.float32).contiguous()   # bf16 router weights widen exactly
            out = self.layer.run_experts(xn, to_numpy(w, "router weights", (torch.float32,)),
                                         to_numpy(ids.contiguous(), "router ids", (torch.int32, torch.int64)))
        else:
            w_np, ids_np = self.layer.route(xn)
            out = self.layer.run_experts(xn, w_np, ids_np)
            scores = torch.from_numpy(w_np).to(hidden_states.dtype)
        y = to_torch(out, hidden_states.dtype == torch.bfloat16).view(shape)
        return (y, scores) if self.family == "gpt_oss" else y

    def extra_repr(self) -> str:
        routing = "model router" if self._router_name else "moe_cpu router"
        return f"family={self.family}, {routing}, " + repr(self.layer).replace("\n ", ";")


def patch(model: torch.nn.Module, scheme: Optional[str] = None, *, group_size: Optional[int] = None,
          routing: str = "model") -> List[str]:
    """Replace every supported sparse MoE block of ``model`` with a :class:`MoECPUBlock`.

    Args:
        model: a loaded transformers model on the CPU, float32 or bfloat16.
        scheme: "int4_w4a8", "int8_w8a8", "fp8_w8a16" or "bf16" (None: "bf16"; bf16 weights are then
            packed as they are, float32 ones rounded to nearest even).
        group_size: int4 / int8 group (``quantize_experts``' defaults: 128 / per channel); must divide
            the hidden and intermediate sizes.
        routing: "model" (the block's router picks the experts) or "moe_cpu" (see MoECPUBlock).

    Returns the qualified names of the replaced modules. Every block is checked before any is
    replaced; a model without a supported block raises ValueError.
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing = {routing!r} must be one of {ROUTINGS}")
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    found: List[Tuple[str, torch.nn.Module, str, torch.nn.Module, str, Dict[str, Any]]] = []
    for pname, parent in model.named_modules():
        for cname, child in parent.named_children():
            family = _family(child)
            if family is not None:
                found.append((f"{pname}.{cname}" if pname else cname, parent, cname, child, family,
                              _spec(child, family, config)))
    if not found:
        already = any(isinstance(m, MoECPUBlock) for m in model.modules())
        raise ValueError(f"{type(model).__name__} has no supported MoE block"
                         + (" left (it is already patched)" if already else
                            f" (supported: {', '.join(c for _, c in SUPPORTED_BLOCKS)})"))
    names = [f[0] for f in found]
    while found:   # one at a time, dropping each block's references: its weights go as we go
        _, parent, cname, child, family, s = found.pop(0)
        setattr(parent, cname, MoECPUBlock._build(child, family, s, scheme or "bf16", group_size, routing))
    return names
