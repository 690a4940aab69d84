"""Load one MoE layer from a GGUF file (llama.cpp) with gguf's GGUFReader (memory-mapped).

GGUF lists dimensions innermost first: an expert tensor with ``ne = [K, N, E]`` is the row-major
array ``[E, N, K]``. Expert tensors: ``blk.L.ffn_{gate,up,down}_exps.weight`` (or the fused
``ffn_gate_up_exps.weight``, gate rows first), router ``blk.L.ffn_gate_inp.weight``, shared expert
``blk.L.ffn_{gate,up,down}_shexp.weight``, optional biases ``*.bias``, ``blk.L.exp_probs_b.bias``.

Types (lossless unless noted):
- Q4_0 (per 32 elements: fp16 ``d`` then 16 bytes; byte j holds element j in its low nibble and
  element j + 16 in its high nibble; value = (nibble - 8) * d) -> int4_w4a8, group_size 32;
- Q8_0 (fp16 ``d`` then 32 int8) -> int8_w8a8, group_size 32; Q4_0 and Q8_0 mixed in one layer
  -> int8_w8a8 for all (int4 codes are int8 codes);
- BF16 -> bf16 exactly; F16 and F32 are unquantized: quantized on load to ``scheme``, by default
  bf16 (rounded to nearest even, so F16 values with more than 8 significant bits change);
- any other type raises ``ValueError("unsupported GGUF type <NAME> for tensor <name>")``.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import numpy as np

from ._common import LayerWeights, Part, Source, build_experts, resolve_scheme
from .config import config_from_gguf

__all__ = ["load_gguf_layer"]

QK = 32                                   # Q4_0 / Q8_0 block length
_NATIVE = {"Q4_0": ("int4_w4a8", QK), "Q8_0": ("int8_w8a8", QK),
           "BF16": ("float", -1), "F16": ("float", -1), "F32": ("float", -1)}


def _type(t: Any) -> str:
    return t.tensor_type.name


def _decode(t: Any, row: np.ndarray, N: int, K: int) -> Part:
    """One expert's [N, K] slice of GGUF tensor ``t`` (raw rows from the memory map) -> Part."""
    typ = _type(t)
    if typ in ("Q4_0", "Q8_0"):
        size = 2 + (QK // 2 if typ == "Q4_0" else QK)
        blocks = np.asarray(row, np.uint8).reshape(N, K // QK, size)
        d = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[..., 2:]
        if typ == "Q4_0":   # low nibbles: elements 0..15, high nibbles: 16..31
            q = (np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - 8).reshape(N, K)
        else:
            q = np.ascontiguousarray(qs).view(np.int8).reshape(N, K)
        return Part("int", q, d)
    if typ == "BF16":
        bits = np.asarray(row).view(np.uint16).reshape(N, K)
        return Part("float", (bits.astype(np.uint32) << 16).view(np.float32))
    return Part("float", np.asarray(row, np.float32).reshape(N, K))   # F16 / F32


def _dequant(t: Any, name: str, shape: Tuple[int, ...]) -> np.ndarray:
    """A small tensor (router, biases) as float32 of ``shape``; Q4_0 / Q8_0 decode exactly (q * d)."""
    typ = _type(t)
    if typ not in _NATIVE:
        raise ValueError(f"unsupported GGUF type {typ} for tensor {name}")
    rows = int(np.prod(shape[:-1]))
    p = _decode(t, np.asarray(t.data).reshape(rows, -1), rows, shape[-1])
    v = p.q if p.kind == "float" else p.q.astype(np.float32) * np.repeat(p.scales, QK, axis=1)
    return np.ascontiguousarray(v.reshape(shape), np.float32)


class _File:
    """A GGUF file: metadata lookups and shape-checked tensor access."""

    def __init__(self, path: str):
        try:
            from gguf import GGUFReader
        except ImportError:
            raise ImportError("loading .gguf files needs llama.cpp's 'gguf' package (pip install gguf)") from None
        try:
            self.r = GGUFReader(path, "r")
        except Exception as err:   # gguf raises ValueError / struct.error / others on bad files
            raise ValueError(f"{path}: not a readable GGUF file ({err})") from None
        self.path = path
        self.tensors = {t.name: t for t in self.r.tensors}

    def get(self, key: str) -> Any:
        f = self.r.fields.get(key)
        return None if f is None else f.contents()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str, ne: Tuple[int, ...], what: str = "") -> Any:
        """The tensor, after checking it exists and has GGUF shape ``ne`` (innermost first)."""
        t = self.tensors.get(name)
        if t is None:
            raise ValueError(f"missing tensor {name}{' (' + what + ')' if what else ''} in {self.path}")
        got = tuple(int(x) for x in t.shape)
        if got != tuple(ne):
            raise ValueError(f"tensor {name}: GGUF shape (ne, innermost first) {list(got)} but {list(ne)} "
                             f"was expected, i.e. row-major {list(ne[::-1])}")
        if _type(t) not in _NATIVE:
            raise ValueError(f"unsupported GGUF type {_type(t)} for tensor {name}")
        return t

    def source(self, name: str, N: int, K: int, E: Optional[int]) -> Source:
        """Source over the experts of ``name`` ([E, N, K]; E None: a 2-D shared-expert tensor)."""
        t = self.tensor(name, (K, N) if E is None else (K, N, E))
        native, g = _NATIVE[_type(t)]
        return Source(name, N, native, g, lambda e: _decode(t, t.data if E is None else t.data[e], N, K))

    def vector(self, name: str, ne: Tuple[int, ...]) -> np.ndarray:
        return _dequant(self.tensor(name, ne), name, tuple(ne[::-1]))


def load_gguf_layer(path: Any, layer_idx: int, scheme: Optional[str] = None,
                    group_size: Optional[int] = None, block_size: Tuple[int, int] = (128, 128)) -> LayerWeights:
    """Load layer ``layer_idx`` of a GGUF file (see ``moe_cpu.loaders.load_layer``)."""
    path = os.fspath(path)
    f = _File(path)
    arch = f.get("general.architecture")
    if not arch:
        raise ValueError(f"{path}: required GGUF key 'general.architecture' is missing")
    n_layers = f.get(f"{arch}.block_count")
    if n_layers is not None and not 0 <= layer_idx < int(n_layers):
        raise ValueError(f"{path}: layer {layer_idx} is out of range ({arch}.block_count = {n_layers})")
    p = f"blk.{layer_idx}."
    if not f.has(p + "ffn_gate_inp.weight"):
        dense = f.get(f"{arch}.leading_dense_block_count") or 0
        if layer_idx < dense:
            raise ValueError(f"{path}: layer {layer_idx} is a dense block, not MoE "
                             f"({arch}.leading_dense_block_count = {dense})")
        raise ValueError(f"missing tensor {p}ffn_gate_inp.weight in {path}: layer {layer_idx} has no MoE router")
    E = f.get(f"{arch}.expert_count")
    if E is None:
        raise ValueError(f"{path}: required GGUF key '{arch}.expert_count' is missing")
    E = int(E)
    fused = f.has(p + "ffn_gate_up_exps.weight")
    up = p + ("ffn_gate_up_exps.weight" if fused else "ffn_up_exps.weight")
    if up not in f.tensors:
        raise ValueError(f"missing tensor {up} in {path}")
    # H and I from metadata when present, else from the tensors (validated below either way)
    ne_up = [int(x) for x in f.tensors[up].shape]
    H = int(f.get(f"{arch}.embedding_length") or ne_up[0])
    I = int(f.get(f"{arch}.expert_feed_forward_length") or (ne_up[1] // 2 if fused else ne_up[1]))
    conf = config_from_gguf(f.get, arch, layer_idx, H, I, path)

    if fused:
        w13_src = [f.source(up, 2 * I, H, E)]
    else:
        w13_src = [f.source(p + "ffn_gate_exps.weight", I, H, E), f.source(up, I, H, E)]
    w2_src = [f.source(p + "ffn_down_exps.weight", H, I, E)]
    sch = resolve_scheme(w13_src + w2_src, scheme, f"layer {layer_idx} routed experts")
    w13 = build_experts(w13_src, E, H, sch, f"w13 ({w13_src[0].name}, ...)", group_size, block_size)
    w2 = build_experts(w2_src, E, I, sch, f"w2 ({w2_src[0].name})", group_size, block_size)
    gate = f.vector(p + "ffn_gate_inp.weight", (H, E))

    # optional vectors
    opt = lambda name, ne: f.vector(name, ne) if f.has(name) else None  # noqa: E731
    if fused:
        w13_bias = opt(p + "ffn_gate_up_exps.bias", (2 * I, E))
    else:
        gb, ub = opt(p + "ffn_gate_exps.bias", (I, E)), opt(p + "ffn_up_exps.bias", (I, E))
        if (gb is None) != (ub is None):
            raise ValueError(f"missing tensor {p}ffn_{'up' if ub is None else 'gate'}_exps.bias "
                             f"(the other gate/up bias is present) in {path}")
        w13_bias = None if gb is None else np.ascontiguousarray(np.concatenate([gb, ub], axis=1))
    w2_bias = opt(p + "ffn_down_exps.bias", (H, E))

    shared = [None, None]
    if f.has(p + "ffn_gate_shexp.weight"):
        Is = int(f.tensors[p + "ffn_gate_shexp.weight"].shape[1])
        conf.shared_intermediate_size = Is
        s13 = [f.source(p + "ffn_gate_shexp.weight", Is, H, None), f.source(p + "ffn_up_shexp.weight", Is, H, None)]
        s2 = [f.source(p + "ffn_down_shexp.weight", H, Is, None)]
        ssch = resolve_scheme(s13 + s2, scheme, f"layer {layer_idx} shared expert")
        shared = [build_experts(s13, 1, H, ssch, f"shared_w13 ({p}ffn_gate_shexp, ffn_up_shexp)",
                                group_size, block_size),
                  build_experts(s2, 1, Is, ssch, f"shared_w2 ({p}ffn_down_shexp)", group_size, block_size)]
    elif conf.shared_intermediate_size:
        raise ValueError(f"missing tensor {p}ffn_gate_shexp.weight in {path}: "
                         f"{arch}.expert_shared_feed_forward_length declares a shared expert")
    else:
        conf.shared_intermediate_size = None
    return LayerWeights(w13=w13, w2=w2, gate=gate, config=conf, w13_bias=w13_bias, w2_bias=w2_bias,
                        shared_w13=shared[0], shared_w2=shared[1],
                        e_score_correction_bias=opt(p + "exp_probs_b.bias", (E,)),
                        gate_bias=opt(p + "ffn_gate_inp.bias", (E,)),
                        shared_expert_gate=opt(p + "ffn_gate_inp_shexp.weight", (H,)),
                        source=f"gguf {arch} {_type(f.tensors[w13_src[0].name])} -> {sch} ({path})")
