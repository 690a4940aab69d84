"""Shared pieces of the loaders: the LayerWeights result, per-expert parts and the expert stacker.

A format reader turns one expert's tensor into a :class:`Part` (integer codes + scales, fp8 codes +
block scales, or float32 values). :func:`build_experts` streams the experts one at a time into
preallocated ``[E, N, K]`` code / scale arrays (never a float copy of the layer) and packs them once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from .. import api
from .._core import PackedExperts
from .config import MoEConfig

__all__ = ["LayerWeights", "Part", "Source", "resolve_scheme", "resolve_pair", "build_experts", "bf16_bits_to_f32",
           "check_expert_ids"]

INT_SCHEMES = ("int4_w4a8", "int8_w8a8")
# MXFP4's e2m1 values times 2 (integers), so a block's weight is MXFP4_VALUES[q] * 2^(e8m0 - 128).
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def mxfp4_scales(e8m0: np.ndarray) -> np.ndarray:
    """float32 2^(e - 128) per e8m0 byte: the group scale that goes with MXFP4_VALUES (exact)."""
    return np.ldexp(np.float32(1), e8m0.astype(np.int32) - 128).astype(np.float32)


@dataclass
class LayerWeights:
    """One MoE layer's weights as plain data, for ``moe_cpu.fused_experts`` or
    ``moe_cpu.MoELayer.from_weights`` (the loaders never build a layer themselves).

    Attributes:
        w13: PackedExperts ``[E, 2I, H]``: rows [0, I) gate, [I, 2I) up (gpt-oss safetensors:
            interleaved gate/up rows, activation "swigluoai").
        w2: PackedExperts ``[E, H, I]`` of the same scheme.
        gate: router weight, float32 ``[E, H]`` (logits = x @ gate.T).
        config: the layer's :class:`MoEConfig` (top_k, routing, activation, sizes, model_type).
        w13_bias, w2_bias: float32 ``[E, 2I]`` / ``[E, H]`` expert biases, or None.
        shared_w13, shared_w2: one-expert PackedExperts of the shared expert, or None.
        e_score_correction_bias: float32 ``[E]`` (DeepSeek-V3 noaux_tc), or None.
        gate_bias: float32 ``[E]`` router bias (gpt-oss: logits = x @ gate.T + gate_bias), or None.
        shared_expert_gate: float32 ``[H]`` (Qwen2-MoE: the shared expert's output is multiplied by
            sigmoid(x @ shared_expert_gate)), or None.
        source: a short description of what was read (format, scheme, file).
        experts: the global ids of the experts held, in order (``load_layer(..., experts=...)``:
            w13 / w2 / the expert biases then hold only those; gate and routing stay global), or
            None for all of them.
    """
    w13: PackedExperts
    w2: PackedExperts
    gate: np.ndarray
    config: MoEConfig
    w13_bias: Optional[np.ndarray] = None
    w2_bias: Optional[np.ndarray] = None
    shared_w13: Optional[PackedExperts] = None
    shared_w2: Optional[PackedExperts] = None
    e_score_correction_bias: Optional[np.ndarray] = None
    gate_bias: Optional[np.ndarray] = None
    shared_expert_gate: Optional[np.ndarray] = None
    source: str = ""
    experts: Optional[Tuple[int, ...]] = None

    @property
    def scheme(self) -> str:
        """The routed experts' scheme (one of ``moe_cpu.SCHEMES``)."""
        return self.w13.scheme


@dataclass
class Part:
    """One expert's slice of a projection, rows [r0, r0 + n) of the stacked tensor.

    kind "int": q int8 ``[n, K]`` (with ``codebook``: uint8 indices) and scales float32 ``[n, G]``,
    optional mins float32 ``[n, G]`` (the weight is value * scale - min); "fp8": q uint8 e4m3fn codes
    and scales float32 ``[ceil(n/bn), ceil(K/bk)]`` with ``bn`` given; "float": q float32 ``[n, K]``.
    """
    kind: str
    q: np.ndarray
    scales: Optional[np.ndarray] = None
    bn: int = 0
    mins: Optional[np.ndarray] = None
    codebook: Optional[Tuple[int, ...]] = None


@dataclass
class Source:
    """One projection tensor (for every expert): its rows in the stack, what it holds, a reader.

    native: the scheme its data is in ("int4_w4a8", "int8_w8a8", "fp8_w8a16") or "float";
    group: int group size (-1 per channel) or fp8 (bn, bk); read(e) -> Part of expert e.
    codebook: int4 whose codes index 16 values (GGUF IQ4_NL / IQ4_XS / MXFP4 / Q4_K), else None;
    mins: True when its parts carry group offsets.
    """
    name: str
    rows: int
    native: str
    group: object
    read: Callable[[int], Part]
    codebook: Optional[Tuple[int, ...]] = None
    mins: bool = False


def check_expert_ids(experts: Optional[Sequence[int]], E: int) -> Optional[Tuple[int, ...]]:
    """None, or ``experts`` as a tuple of distinct ints in [0, E) (ValueError otherwise)."""
    if experts is None:
        return None
    try:
        ids = tuple(int(e) for e in experts)
    except (TypeError, ValueError):
        raise ValueError(f"experts must be a sequence of expert ids, got {experts!r}") from None
    bad = [e for e in ids if not 0 <= e < E]
    if bad:
        raise ValueError(f"experts: id {bad[0]} is out of range for {E} experts")
    if len(set(ids)) != len(ids):
        raise ValueError(f"experts: ids must be distinct, got {list(ids)}")
    return ids


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits -> float32 values (exact)."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def resolve_scheme(sources: Sequence[Source], requested: Optional[str], what: str) -> str:
    """The one scheme for all routed (or all shared) projections.

    Float tensors are quantized to ``requested`` (bf16 when None). Integer checkpoints keep their
    codes: int4 and int8 parts together become int8 (int4 codes are valid int8 codes, lossless);
    ``requested`` may only widen int4 to int8. Mixing float and quantized tensors is an error.
    """
    natives = {s.native for s in sources}
    names = ", ".join(s.name for s in sources)
    if natives <= set(INT_SCHEMES):   # int4 stays int4 only with one codebook and groups of 32s
        gs = [s.group for s in sources if s.group != -1]
        if len({s.codebook for s in sources}) > 1 or (gs and math.gcd(*gs) % 32):
            natives = natives | {"int8_w8a8"}
    if natives == {"float"}:
        return requested or "bf16"
    if "float" in natives:
        raise ValueError(f"{what}: tensors {names} mix quantized and unquantized types; load_layer "
                         "cannot combine them into one scheme")
    if natives <= set(INT_SCHEMES):
        scheme = "int8_w8a8" if "int8_w8a8" in natives or requested == "int8_w8a8" else "int4_w4a8"
    elif natives == {"fp8_w8a16"}:
        scheme = "fp8_w8a16"
    else:
        raise ValueError(f"{what}: tensors {names} are quantized differently ({sorted(natives)})")
    if requested not in (None, scheme):
        raise ValueError(f"{what}: the checkpoint is already quantized ({scheme} from {sorted(natives)}); "
                         f"scheme={requested!r} would need requantization, which load_layer does not do "
                         f"(pass scheme=None or {scheme!r})")
    return scheme


def resolve_pair(w13: Sequence[Source], w2: Sequence[Source], requested: Optional[str],
                 what: str) -> Tuple[str, str]:
    """Schemes of (w13, w2): one scheme as resolve_scheme gives, except that quantized int checkpoints
    keep each side's own form (fused_experts takes int4 / int8 in any pair)."""
    both = resolve_scheme(list(w13) + list(w2), requested, what)
    if both in INT_SCHEMES and all(s.native in INT_SCHEMES for s in list(w13) + list(w2)):
        return resolve_scheme(w13, requested, what + " w13"), resolve_scheme(w2, requested, what + " w2")
    return both, both


def _stack_group(sources: Sequence[Source], scheme: str, group_size: Optional[int],
                 block: Tuple[int, int], what: str, K: int) -> object:
    """Group size (int schemes) or (bn, bk) block (fp8) of the stacked tensor."""
    if sources[0].native == "float":
        if scheme in INT_SCHEMES:
            return (128 if scheme == "int4_w4a8" else -1) if group_size is None else group_size
        return tuple(block) if scheme == "fp8_w8a16" else -1
    groups = {s.group for s in sources}
    if scheme in INT_SCHEMES and len(groups) > 1:   # the finest group that every source's groups split into
        return math.gcd(*[K if g == -1 else g for g in groups])
    if len(groups) != 1:
        raise ValueError(f"{what}: tensors {', '.join(s.name for s in sources)} use different groups / blocks "
                         f"{sorted(groups, key=str)}")
    g = groups.pop()
    if scheme == "fp8_w8a16":   # row blocks must not straddle gate/up: refine to gcd(bn, row offsets)
        bn, bk = g
        for r in np.cumsum([s.rows for s in sources])[:-1]:
            bn = math.gcd(bn, int(r))
        return (bn, bk)
    return g


def build_experts(sources: Sequence[Source], E: int, K: int, scheme: str, what: str,
                  group_size: Optional[int] = None, block: Tuple[int, int] = (128, 128),
                  experts: Optional[Sequence[int]] = None) -> PackedExperts:
    """Stream experts 0..E-1 of ``sources`` (stacked along rows) into one PackedExperts; with
    ``experts`` (global ids), only those, in that order: the others are never read.

    Quantized parts are copied code for code; float parts of one expert are concatenated and quantized
    with ``quantize_experts`` on that expert alone ([1, N, K]), which is bit-exact with quantizing the
    whole stacked layer at once (groups and blocks never cross experts).
    """
    ids = list(range(E)) if experts is None else [int(e) for e in experts]
    E = len(ids)
    if E == 0:   # a rank that holds no experts of this layer
        return None
    N = sum(s.rows for s in sources)
    g = _stack_group(sources, scheme, group_size, block, what, K)
    from_float = sources[0].native == "float"
    # int4 kept as int4 stores codebook indices when the sources have a codebook (all the same one)
    codebook = sources[0].codebook if scheme == "int4_w4a8" and not from_float else None
    m = None
    if scheme in INT_SCHEMES:
        if not (g == -1 or (isinstance(g, int) and g > 0 and K % g == 0)):
            raise ValueError(f"{what}: group_size = {g} must divide K = {K} (or be -1)")
        q = np.empty((E, N, K), np.uint8 if codebook is not None else np.int8)
        s = np.empty((E, N, 1 if g == -1 else K // g), np.float32)
        if any(src.mins for src in sources):
            m = np.zeros(s.shape, np.float32)
    elif scheme == "fp8_w8a16":
        q = np.empty((E, N, K), np.uint8)
        s = np.empty((E, -(-N // g[0]), -(-K // g[1])), np.float32)
    else:
        q, s = np.empty((E, N, K), np.uint16), None
    for e, eid in enumerate(ids):
        parts = [src.read(eid) for src in sources]
        if from_float:
            w = parts[0].q if len(parts) == 1 else np.concatenate([p.q for p in parts])
            try:
                d = api.quantize_experts(np.ascontiguousarray(w[None], np.float32), scheme,
                                         None if scheme in ("fp8_w8a16", "bf16") else g, block).unpack_quantized()
            except ValueError as err:
                raise ValueError(f"{what}: expert {eid}: {err}") from None
            q[e] = d.get("qweight", d.get("weight"))[0]
            if s is not None:
                s[e] = d.get("scales", d.get("scale_inv"))[0]
            continue
        r0 = 0
        for src, p in zip(sources, parts):
            n = src.rows
            if scheme == "int8_w8a8" and p.codebook is not None:   # int4 indices widened to their int8 values
                q[e, r0:r0 + n] = np.asarray(p.codebook, np.int8)[p.q]
            else:
                q[e, r0:r0 + n] = p.q
            if scheme in INT_SCHEMES:   # source groups may be coarser than the stack's: repeat their scales
                rep = s.shape[2] // p.scales.shape[1]
                s[e, r0:r0 + n] = np.repeat(p.scales, rep, axis=1) if rep > 1 else p.scales
                if p.mins is not None:
                    m[e, r0:r0 + n] = np.repeat(p.mins, rep, axis=1) if rep > 1 else p.mins
            elif scheme == "fp8_w8a16":     # expand source row blocks (bn) to the stack's (g[0] divides bn)
                bn = g[0]
                rows = (np.arange(-(-n // bn)) * bn) // p.bn
                s[e, r0 // bn: r0 // bn + len(rows)] = p.scales[rows]
            r0 += n
    try:
        if scheme == "int4_w4a8":
            return api.pack_int4(q, s, group_size=g, codebook=codebook, mins=m)
        if scheme == "int8_w8a8":
            return api.pack_int8(q, s, group_size=g, mins=m)
        if scheme == "fp8_w8a16":
            return api.pack_fp8(q, s, block_size=g)
        return api.pack_bf16(q)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None

