"""MoE hyper-parameters of one layer, read from a Hugging Face ``config.json`` or GGUF metadata.

Both readers return a :class:`MoEConfig`. A missing required key, an unknown model type or a layer
that is not a Mixture-of-Experts layer raises ``ValueError`` naming the key or the layer.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = ["MoEConfig", "config_from_hf", "config_from_gguf"]


@dataclass
class MoEConfig:
    """Routing and shape parameters of one MoE layer (names follow ``moe_cpu.select_experts``).

    ``intermediate_size`` is the routed experts' I; ``shared_intermediate_size`` the shared
    expert's (None when the model has none). ``activation`` is a ``moe_cpu.ACTIVATIONS`` name:
    gpt-oss safetensors keep gate/up interleaved ("swigluoai"), its GGUF splits them
    ("swigluoai_uninterleave").
    """
    model_type: str
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    renormalize: bool = False
    scoring_func: str = "softmax"
    use_grouped_topk: bool = False
    num_expert_group: Optional[int] = None
    topk_group: Optional[int] = None
    routed_scaling_factor: float = 1.0
    activation: str = "silu"
    shared_intermediate_size: Optional[int] = None

    def as_dict(self) -> Dict[str, Any]:
        """All fields as a plain dict."""
        return dataclasses.asdict(self)

    def routing_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for ``moe_cpu.select_experts`` / ``MoELayer`` (without top_k and the bias)."""
        return dict(renormalize=self.renormalize, scoring_func=self.scoring_func,
                    use_grouped_topk=self.use_grouped_topk, num_expert_group=self.num_expert_group,
                    topk_group=self.topk_group, routed_scaling_factor=self.routed_scaling_factor)


# Hugging Face hidden_act -> moe_cpu activation
_HF_ACT = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
           "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def _req(cfg: Dict[str, Any], key: str, where: str) -> Any:
    if cfg.get(key) is None:
        raise ValueError(f"{where}: required key '{key}' is missing")
    return cfg[key]


def _int(v: Any, key: str, where: str, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{where}: '{key}' = {v!r} must be an integer >= {lo}")
    return v


# One quantity under the names that transformers 4 and 5 (and original releases) write for it.
_NUM_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
_TOP_K = ("num_experts_per_tok", "experts_per_token")


def _aliased(cfg: Dict[str, Any], names: Tuple[str, ...], where: str) -> int:
    """The integer under whichever of `names` the config has; two names with different values raise."""
    found = {n: cfg[n] for n in names if cfg.get(n) is not None}
    if not found:
        raise ValueError(f"{where}: required key '{names[0]}' is missing (also accepted: {', '.join(names[1:])})")
    vals = {n: _int(v, n, where) for n, v in found.items()}
    if len(set(vals.values())) > 1:
        raise ValueError(f"{where}: {' and '.join(f'{n} = {v}' for n, v in vals.items())} disagree")
    return next(iter(vals.values()))


def _act(cfg: Dict[str, Any], where: str) -> str:
    name = cfg.get("hidden_act", "silu")
    if name not in _HF_ACT:
        raise ValueError(f"{where}: hidden_act = {name!r} is not supported (expected one of {sorted(_HF_ACT)})")
    return _HF_ACT[name]


def config_from_hf(cfg: Dict[str, Any], layer_idx: int, where: str = "config.json") -> MoEConfig:
    """MoEConfig of layer ``layer_idx`` from a Hugging Face config dict.

    Supported ``model_type``: qwen2_moe, qwen3_moe (moe_intermediate_size, norm_topk_prob,
    shared_expert_intermediate_size), mixtral (always renormalized), deepseek_v2 / deepseek_v3 /
    kimi_k2 (n_group, topk_group, topk_method, scoring_func, routed_scaling_factor,
    n_shared_experts, first_k_dense_replace, moe_layer_freq) and gpt_oss (swigluoai with
    swiglu_limit 7 and swiglu_alpha 1.702).

    Keys that transformers renamed are read under every name, for every family: the expert count
    as ``num_experts`` (transformers 4 Qwen), ``num_local_experts`` (transformers 5, Mixtral,
    gpt-oss) or ``n_routed_experts`` (DeepSeek); top-k as ``num_experts_per_tok`` or
    ``experts_per_token`` (gpt-oss' original config). Two names with different values raise.
    """
    mt = _req(cfg, "model_type", where)
    H = _int(_req(cfg, "hidden_size", where), "hidden_size", where)
    nl = cfg.get("num_hidden_layers")
    if isinstance(nl, int) and not 0 <= layer_idx < nl:
        raise ValueError(f"{where}: layer {layer_idx} is out of range (num_hidden_layers = {nl})")
    g = lambda k: _int(_req(cfg, k, where), k, where)  # noqa: E731
    E = lambda: _aliased(cfg, _NUM_EXPERTS, where)  # noqa: E731
    K = lambda: _aliased(cfg, _TOP_K, where)  # noqa: E731

    if mt in ("qwen2_moe", "qwen3_moe"):
        step = cfg.get("decoder_sparse_step", 1) or 1
        if layer_idx in (cfg.get("mlp_only_layers") or []) or (layer_idx + 1) % step:
            raise ValueError(f"{where}: layer {layer_idx} is a dense MLP layer, not MoE "
                             f"(mlp_only_layers / decoder_sparse_step = {step})")
        shared = cfg.get("shared_expert_intermediate_size") if mt == "qwen2_moe" else None
        return MoEConfig(mt, E(), K(), H, g("moe_intermediate_size"),
                         renormalize=bool(cfg.get("norm_topk_prob", False)), activation=_act(cfg, where),
                         shared_intermediate_size=shared or None)
    if mt == "mixtral":
        return MoEConfig(mt, E(), K(), H, g("intermediate_size"), renormalize=True, activation=_act(cfg, where))
    if mt in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        dense = cfg.get("first_k_dense_replace", 0) or 0
        freq = cfg.get("moe_layer_freq", 1) or 1
        if layer_idx < dense or layer_idx % freq:
            raise ValueError(f"{where}: layer {layer_idx} is a dense MLP layer, not MoE "
                             f"(first_k_dense_replace = {dense}, moe_layer_freq = {freq})")
        I = g("moe_intermediate_size")
        method = cfg.get("topk_method", "noaux_tc" if mt != "deepseek_v2" else "greedy")
        if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ValueError(f"{where}: topk_method = {method!r} is not supported "
                             "(expected greedy, group_limited_greedy or noaux_tc)")
        grouped = method != "greedy"
        scoring = cfg.get("scoring_func", "sigmoid" if mt != "deepseek_v2" else "softmax")
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"{where}: scoring_func = {scoring!r} must be 'softmax' or 'sigmoid'")
        ns = cfg.get("n_shared_experts") or 0
        return MoEConfig(mt, E(), K(), H, I,
                         renormalize=bool(cfg.get("norm_topk_prob", False)), scoring_func=scoring,
                         use_grouped_topk=grouped, num_expert_group=g("n_group") if grouped else None,
                         topk_group=g("topk_group") if grouped else None,
                         routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
                         activation=_act(cfg, where), shared_intermediate_size=I * ns if ns else None)
    if mt == "gpt_oss":
        limit = cfg.get("swiglu_limit", 7.0)
        if float(limit) != 7.0:
            raise ValueError(f"{where}: swiglu_limit = {limit} is not supported (moe_cpu's swigluoai clamps at 7)")
        alpha = cfg.get("swiglu_alpha", 1.702)
        if float(alpha) != 1.702:
            raise ValueError(f"{where}: swiglu_alpha = {alpha} is not supported (moe_cpu's swigluoai uses 1.702)")
        return MoEConfig(mt, E(), K(), H, g("intermediate_size"), renormalize=True, activation="swigluoai")
    raise ValueError(f"{where}: model_type = {mt!r} is not supported (expected one of qwen2_moe, qwen3_moe, "
                     "mixtral, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss)")


# GGUF: llama.cpp normalizes the top-k weights per architecture (build_moe_ffn's norm_w) unless
# {arch}.expert_weights_norm says otherwise.
_GGUF_NORM = {"llama": True, "mixtral": True, "qwen3moe": True, "qwen2moe": False, "gpt-oss": True,
              "deepseek2": False}


def config_from_gguf(get: Callable[[str], Any], arch: str, layer_idx: int, H: int, I: int,
                     where: str) -> MoEConfig:
    """MoEConfig from GGUF metadata. ``get(key)`` returns a value or None; H and I come from the tensors.

    Keys: ``{arch}.expert_count`` and ``{arch}.expert_used_count`` (required),
    ``expert_gating_func`` (1 softmax, 2 sigmoid, 3 softmax over the selected; default softmax),
    ``expert_weights_norm`` (default per architecture), ``expert_weights_scale`` (0 or absent: 1),
    ``expert_group_count`` / ``expert_group_used_count`` (grouped top-k when > 1),
    ``leading_dense_block_count``, ``expert_shared_feed_forward_length``.
    """
    def req(name: str) -> int:
        v = get(f"{arch}.{name}")
        if v is None:
            raise ValueError(f"{where}: required GGUF key '{arch}.{name}' is missing")
        return _int(int(v), f"{arch}.{name}", where)

    dense = get(f"{arch}.leading_dense_block_count") or 0
    if layer_idx < dense:
        raise ValueError(f"{where}: layer {layer_idx} is a dense block, not MoE "
                         f"({arch}.leading_dense_block_count = {dense})")
    E, k = req("expert_count"), req("expert_used_count")
    gating = int(get(f"{arch}.expert_gating_func") or 1)
    if gating not in (1, 2, 3):
        raise ValueError(f"{where}: {arch}.expert_gating_func = {gating} is not supported "
                         "(1 softmax, 2 sigmoid, 3 softmax over the selected)")
    norm = get(f"{arch}.expert_weights_norm")
    if gating == 3:
        norm = True
    elif norm is None:
        if arch not in _GGUF_NORM:
            raise ValueError(f"{where}: key '{arch}.expert_weights_norm' is missing and architecture "
                             f"{arch!r} has no known default")
        norm = _GGUF_NORM[arch]
    scale = float(get(f"{arch}.expert_weights_scale") or 0.0) or 1.0
    groups = int(get(f"{arch}.expert_group_count") or 0)
    grouped = groups > 1
    used = req("expert_group_used_count") if grouped else None
    shared = get(f"{arch}.expert_shared_feed_forward_length")
    return MoEConfig(arch, E, k, H, I, renormalize=bool(norm), scoring_func="sigmoid" if gating == 2 else "softmax",
                     use_grouped_topk=grouped, num_expert_group=groups if grouped else None, topk_group=used,
                     routed_scaling_factor=scale,
                     activation="swigluoai_uninterleave" if arch == "gpt-oss" else "silu",
                     shared_intermediate_size=int(shared) if shared else None)
