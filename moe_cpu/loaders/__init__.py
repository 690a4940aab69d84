"""Checkpoint loaders: read ONE MoE layer's experts from a checkpoint straight into PackedExperts.

``load_layer(path, layer_idx, scheme=None)`` reads a Hugging Face safetensors checkpoint (a
directory, one ``.safetensors`` file or a list of them, with ``config.json`` beside them) or a
``.gguf`` file. Experts are streamed one at a time: each expert's tensors are read, converted to
integer / fp8 codes (or quantized from float with the ``moe_cpu.quantize_experts`` rules) and copied
into the stacked ``[E, N, K]`` arrays that ``moe_cpu.pack_*`` take; no float copy of the layer is
made. Quantized checkpoints keep their codes and scales bit for bit. Every bad input (unknown
format, missing tensor or config key, wrong shape or dtype, unsupported type) raises ``ValueError``
naming the tensor or key and what was expected.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from ..api import SCHEMES
from ._common import LayerWeights
from .config import MoEConfig

__all__ = ["load_layer", "num_experts", "LayerWeights", "MoEConfig"]

PathLike = Union[str, "os.PathLike[str]"]


def _is_gguf(path: str) -> bool:
    if path.lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def _subset(lw: LayerWeights, experts: Optional[Sequence[int]]) -> LayerWeights:
    """Record the experts held and keep only their rows of the expert biases (the loaders checked the ids)."""
    if experts is None:
        return lw
    lw.experts = tuple(int(e) for e in experts)
    rows = list(lw.experts)
    if lw.w13_bias is not None:
        lw.w13_bias = np.ascontiguousarray(lw.w13_bias[rows])
    if lw.w2_bias is not None:
        lw.w2_bias = np.ascontiguousarray(lw.w2_bias[rows])
    return lw


def load_layer(path: Union[PathLike, Sequence[PathLike]], layer_idx: int, scheme: Optional[str] = None, *,
               group_size: Optional[int] = None, block_size: Tuple[int, int] = (128, 128),
               experts: Optional[Sequence[int]] = None, act_block: object = "auto") -> LayerWeights:
    """Load the MoE layer ``layer_idx`` of a checkpoint into a :class:`LayerWeights`.

    Args:
        path: a directory of ``.safetensors`` files (``model.safetensors.index.json`` is used when
            present), one ``.safetensors`` file, a list of them (``config.json`` must be in the
            directory of the first), or a ``.gguf`` file.
        layer_idx: the decoder layer (0-based); a dense layer raises ValueError.
        scheme: target scheme for UNQUANTIZED weights (F32 / BF16 / F16): one of
            ``moe_cpu.SCHEMES``; None means "bf16" (exact for BF16 checkpoints, rounded to nearest
            even otherwise). Quantized checkpoints load losslessly in their own weights, with the
            activations the file means: weight-only formats (GPTQ, AWQ, compressed-tensors groups
            without input_activations, MXFP4 safetensors) as int4_w4a16 / int8_w8a16, compressed-tensors
            W4A8 / W8A8 and GGUF (Q4_0 -> int4_w4a8 g32, Q8_0 -> int8_w8a8 g32, ...) as A8, DeepSeek FP8 as
            fp8_w8a16. There scheme may be None, the scheme of the same weights with either activations
            (int4_w4a8 / int4_w4a16), or int8_w8a8 / int8_w8a16 for int4 codes (lossless widening).
        group_size: int4 / int8 group size when quantizing float weights (defaults as in
            ``quantize_experts``: 128 for int4, per channel for int8).
        block_size: fp8 ``(bn, bk)`` when quantizing float weights to fp8_w8a16.
        experts: global expert ids to load (expert parallelism): only their tensors are read and
            packed, in this order; the router, routing and shared expert are loaded whole.
        act_block: the A8 activation blocks (docs/numerics.md): "auto" (default) runs what the file means: GGUF
            blocks of 32 (ggml's Q8_0 / Q8_1 for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4; finer than its Q8_K's
            256 for IQ4_XS and the IQ / TQ types), 128 for the K-quants Q2_K ... Q6_K (finer than Q8_K; on AVX2 their
            integer scales sum whole blocks in int32), compressed-tensors dynamic per-token files one scale per token;
            None: one scale per token; 32, 64, 128 or 256: that block for every A8 projection (A16 / fp8 / bf16
            layers refuse a block).

    Returns:
        LayerWeights: w13 ``[E, 2I, H]`` (gate rows then up rows), w2 ``[E, H, I]``, router
        ``gate`` float32 ``[E, H]``, optional biases / shared expert / correction bias, ``config``.
    """
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx must be a non-negative int, got {layer_idx!r}")
    if scheme is not None and scheme not in SCHEMES:
        raise ValueError(f"scheme = {scheme!r} is not one of {SCHEMES} (or None)")
    if not (act_block is None or act_block == "auto" or (isinstance(act_block, int) and not isinstance(act_block, bool))):
        raise ValueError(f"act_block = {act_block!r}: use 'auto' (what the file means), None (per token) or one of "
                         "(32, 64, 128, 256)")
    kw = dict(scheme=scheme, group_size=group_size, block_size=block_size, experts=experts, act_block=act_block)
    if isinstance(path, (list, tuple)):
        from .safetensors_loader import load_safetensors_layer
        return _subset(load_safetensors_layer(path, layer_idx, **kw), experts)
    p = os.fspath(path)
    if not os.path.exists(p):
        raise ValueError(f"{p}: no such file or directory")
    if os.path.isdir(p) or p.lower().endswith(".safetensors"):
        from .safetensors_loader import load_safetensors_layer
        return _subset(load_safetensors_layer(p, layer_idx, **kw), experts)
    if _is_gguf(p):
        from .gguf_loader import load_gguf_layer
        return _subset(load_gguf_layer(p, layer_idx, **kw), experts)
    raise ValueError(f"{p}: unknown checkpoint format (expected a directory or .safetensors files with "
                     "config.json, or a .gguf file)")


def num_experts(path: PathLike, layer_idx: int) -> int:
    """E of layer ``layer_idx`` from the checkpoint's config (safetensors) or metadata (GGUF), no weights read."""
    p = os.fspath(path)
    if not os.path.isdir(p) and _is_gguf(p):
        from .gguf_loader import _File
        f = _File(p)
        arch = f.get("general.architecture")
        E = f.get(f"{arch}.expert_count") if arch else None
        if E is None:
            raise ValueError(f"{p}: GGUF key '{arch}.expert_count' is missing")
        return int(E)
    import json
    from .config import config_from_hf
    from .safetensors_loader import _files
    _, cfg_path = _files(p)
    try:
        with open(cfg_path) as fh:
            cfg = json.load(fh)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{cfg_path}: not a readable config.json ({err})") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict):
        cfg = {"quantization_config": cfg.get("quantization_config"), **cfg["text_config"]}
    return config_from_hf(cfg, layer_idx, cfg_path).num_experts
