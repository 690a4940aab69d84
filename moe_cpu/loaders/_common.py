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
from .._dtypes import from_bf16_bits
from .._core import PackedExperts
from .config import MoEConfig

__all__ = ["LayerWeights", "Part", "Source", "Stack", "resolve_scheme", "resolve_pair", "build_experts", "build_pair",
           "fold_act_order", "bf16_bits_to_f32", "check_expert_ids"]

A8 = api.A8_SCHEMES          # the int weights' own names (Source.native), int8 activations
INT_SCHEMES = A8 + api.A16_SCHEMES


def a16_name(scheme: str) -> str:
    """int4_w4a8 -> int4_w4a16, int8_w8a8 -> int8_w8a16: the same weights with 16-bit activations."""
    return scheme[:-1] + "16"


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

    kind "int": q int8 ``[n, K]`` (with ``codebook`` or ``zeros``: uint8 codes) and scales float32
    ``[n, G]``, optional mins float32 ``[n, G]`` (the weight is value * scale - min), zeros uint8
    ``[n, G]`` (the weight is (u - zero) * scale), g_idx int ``[K]`` (GPTQ act-order: the group of
    each input channel); "fp8": q uint8 e4m3fn codes
    and scales float32 ``[ceil(n/bn), ceil(K/bk)]`` with ``bn`` given; "float": q float32 ``[n, K]``.
    """
    kind: str
    q: np.ndarray
    scales: Optional[np.ndarray] = None
    bn: int = 0
    mins: Optional[np.ndarray] = None
    codebook: Optional[Tuple[int, ...]] = None
    zeros: Optional[np.ndarray] = None
    g_idx: Optional[np.ndarray] = None


@dataclass
class Source:
    """One projection tensor (for every expert): its rows in the stack, what it holds, a reader.

    native: the scheme its data is in ("int4_w4a8", "int8_w8a8", "fp8_w8a16") or "float";
    group: int group size (-1 per channel) or fp8 (bn, bk); read(e) -> Part of expert e.
    codebook: int4 whose codes index 16 values (GGUF IQ4_NL / IQ4_XS / MXFP4 / Q4_K), else None;
    mins: True when its parts carry group offsets; zeros: zero points; act_order: a g_idx.
    a16: int weights of a weight-only format (GPTQ, AWQ, compressed-tensors without input_activations,
    MXFP4), calibrated for 16-bit activations: they load as the A16 scheme unless ``scheme=`` says otherwise.
    """
    name: str
    rows: int
    native: str
    group: object
    read: Callable[[int], Part]
    codebook: Optional[Tuple[int, ...]] = None
    mins: bool = False
    zeros: bool = False
    act_order: bool = False
    a16: bool = False
    act_block: Optional[int] = None   # A8: the activation block its format computes with (GGUF: ggml's vec-dot type)


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
    return from_bf16_bits(bits)


def resolve_scheme(sources: Sequence[Source], requested: Optional[str], what: str) -> str:
    """The one scheme for all routed (or all shared) projections.

    Float tensors are quantized to ``requested`` (bf16 when None). Integer checkpoints keep their
    codes: int4 and int8 parts together become int8 (int4 codes are valid int8 codes, lossless);
    ``requested`` may only widen int4 to int8. Mixing float and quantized tensors is an error.
    Activations: a weight-only format (Source.a16) runs as A16, others as A8; ``requested`` picks
    either for any int checkpoint.
    """
    natives = {s.native for s in sources}
    names = ", ".join(s.name for s in sources)
    if natives <= set(A8):   # int4 stays int4 only with one codebook and groups of 16s (A16: of 32s)
        gs = [s.group for s in sources if s.group != -1]
        a16 = requested in (None, "") and all(s.a16 for s in sources) or (requested or "").endswith("a16")
        short = bool(gs) and math.gcd(*gs) % (32 if a16 else 16) != 0
        if len({s.codebook for s in sources}) > 1 or short:
            if short and requested == "int4_w4a16" and not math.gcd(*gs) % 16:
                raise ValueError(f"{what}: scheme='int4_w4a16' takes int4 groups of 32 or more, but tensors {names} "
                                 f"have int4 groups of {math.gcd(*gs)}; pass scheme='int8_w8a16' (their codes "
                                 "widened to int8, lossless) or 'int4_w4a8'")
            natives = natives | {"int8_w8a8"}
    if natives == {"float"}:
        return requested or "bf16"
    if "float" in natives:
        raise ValueError(f"{what}: tensors {names} mix quantized and unquantized types; load_layer "
                         "cannot combine them into one scheme")
    if natives <= set(A8):
        widen = "int8_w8a8" in natives or (requested or "").startswith("int8")
        scheme = "int8_w8a8" if widen else "int4_w4a8"
    elif natives == {"fp8_w8a16"}:
        scheme = "fp8_w8a16"
    else:
        raise ValueError(f"{what}: tensors {names} are quantized differently ({sorted(natives)})")
    allowed = (scheme, a16_name(scheme)) if scheme in A8 else (scheme,)
    if requested not in (None,) + allowed:
        raise ValueError(f"{what}: the checkpoint is already quantized ({scheme} from {sorted(natives)}); "
                         f"scheme={requested!r} would need requantization, which load_layer does not do "
                         f"(pass scheme=None or one of {list(allowed)})")
    if scheme not in A8:
        return scheme
    if requested is not None:
        return requested
    kinds = {s.a16 for s in sources}
    if len(kinds) > 1:
        raise ValueError(f"{what}: tensors {names} mix weight-only int weights (16-bit activations) with int "
                         "weights quantized for int8 activations; pass scheme= to choose one (e.g. "
                         f"{a16_name(scheme)!r} or {scheme!r})")
    return a16_name(scheme) if kinds.pop() else scheme


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
            return (128 if scheme.startswith("int4") else -1) if group_size is None else group_size
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


@dataclass
class Stack:
    """The codes and scales of one projection for the experts being loaded, before packing."""
    scheme: str
    group: object
    q: np.ndarray
    scales: Optional[np.ndarray]
    mins: Optional[np.ndarray] = None
    zeros: Optional[np.ndarray] = None
    g_idx: Optional[np.ndarray] = None
    codebook: Optional[Tuple[int, ...]] = None
    act_block: Optional[int] = None


def resolve_act_block(sources: Sequence[Source], scheme: str, requested: object) -> Optional[int]:
    """The A8 activation block of a stack: ``requested`` (None: per token, or an int), or with "auto" what the
    sources' format computes (the finest where they differ; per token if any source says so). Other schemes: None
    for "auto", the request otherwise (packing refuses a block there, naming the scheme)."""
    if isinstance(requested, str):
        if requested != "auto":
            raise ValueError(f"act_block = {requested!r}: use 'auto' (what the file means), None (per token) or "
                             "one of (32, 64, 128, 256)")
        if scheme not in A8:
            return None
        blocks = [s.act_block for s in sources]
        return None if any(b is None for b in blocks) else min(blocks)
    return requested


def build_experts(sources: Sequence[Source], E: int, K: int, scheme: str, what: str,
                  group_size: Optional[int] = None, block: Tuple[int, int] = (128, 128),
                  experts: Optional[Sequence[int]] = None, act_block: object = "auto") -> PackedExperts:
    """Stream experts 0..E-1 of ``sources`` (stacked along rows) into one PackedExperts; with
    ``experts`` (global ids), only those, in that order: the others are never read.

    Quantized parts are copied code for code; float parts of one expert are concatenated and quantized
    with ``quantize_experts`` on that expert alone ([1, N, K]), which is bit-exact with quantizing the
    whole stacked layer at once (groups and blocks never cross experts).
    """
    st = gather_experts(sources, E, K, scheme, what, group_size, block, experts)
    if st is None:
        return None
    st.act_block = resolve_act_block(sources, scheme, act_block)
    return pack_stack(st, what)


def build_pair(w13: Sequence[Source], w2: Sequence[Source], E: int, H: int, I: int, schemes: Tuple[str, str],
               what: Tuple[str, str], group_size: Optional[int] = None, block: Tuple[int, int] = (128, 128),
               experts: Optional[Sequence[int]] = None,
               act_block: object = "auto") -> Tuple[PackedExperts, PackedExperts, bool]:
    """(w13, w2, folded) of a layer's gate/up and down sources; folded: a GPTQ act-order w2 was folded
    into w13's row order (``fold_act_order``), so w13's rows are no longer the checkpoint's."""
    s13 = gather_experts(w13, E, H, schemes[0], what[0], group_size, block, experts)
    s2 = gather_experts(w2, E, I, schemes[1], what[1], group_size, block, experts)
    if s13 is None:
        return None, None, False
    folded = fold_act_order(s13, s2, I)
    s13.act_block = resolve_act_block(w13, schemes[0], act_block)
    s2.act_block = resolve_act_block(w2, schemes[1], act_block)
    return pack_stack(s13, what[0]), pack_stack(s2, what[1]), folded


def fold_act_order(s13: Stack, s2: Stack, I: int) -> bool:
    """Act-order w2 at no run-time cost: sort each expert's w2 input channels by group (contiguous
    groups, no g_idx left) and permute w13's gate and up rows the same way, so that GEMM1 writes its
    output in w2's order. Returns whether w2 had a g_idx (and was folded)."""
    if s2.g_idx is None:
        return False
    if s13.q.shape[1] != 2 * I or s13.scheme not in INT_SCHEMES:
        raise ValueError(f"act-order w2 needs separate int gate / up rows in w13 ([2I = {2 * I}, H]), got "
                         f"{s13.scheme} with {s13.q.shape[1]} rows")
    perm = np.argsort(s2.g_idx, axis=1, kind="stable")                     # [E, I]
    s2.q = np.take_along_axis(s2.q, perm[:, None, :], axis=2)
    s2.g_idx = None
    rows = np.concatenate([perm, perm + I], axis=1)                        # [E, 2I]
    for name in ("q", "scales", "mins", "zeros"):
        a = getattr(s13, name)
        if a is not None:
            setattr(s13, name, np.take_along_axis(a, rows[:, :, None], axis=1))
    return True


def gather_experts(sources: Sequence[Source], E: int, K: int, scheme: str, what: str,
                   group_size: Optional[int] = None, block: Tuple[int, int] = (128, 128),
                   experts: Optional[Sequence[int]] = None) -> Optional[Stack]:
    """The Stack of ``sources`` for experts 0..E-1 (or ``experts``), read one expert at a time."""
    ids = range(E) if experts is None else [int(e) for e in experts]
    E = len(ids)
    if E == 0:   # a rank that holds no experts of this layer
        return None
    N = sum(s.rows for s in sources)
    g = _stack_group(sources, scheme, group_size, block, what, K)
    from_float = sources[0].native == "float"
    # The first and last experts' tensors are read (their presence and shapes checked against the config)
    # before the stack is allocated: a config that does not match its tensors is a ValueError, not a huge
    # allocation.
    first = [src.read(ids[0]) for src in sources]
    last = [src.read(ids[-1]) for src in sources] if E > 1 else first
    # int4 kept as int4 stores codebook indices when the sources have a codebook (all the same one)
    codebook = sources[0].codebook if scheme.startswith("int4") and not from_float else None
    m = z = gi = None
    if scheme in INT_SCHEMES:
        if not (g == -1 or (isinstance(g, int) and g > 0 and K % g == 0)):
            raise ValueError(f"{what}: group_size = {g} must divide K = {K} (or be -1)")
        zp = [src.zeros for src in sources]
        if any(zp) and not all(zp):
            raise ValueError(f"{what}: tensors {', '.join(s.name for s in sources)} mix zero-point and "
                             "symmetric weights")
        keep_zeros = all(zp) and not from_float and scheme.startswith("int4")
        q = np.empty((E, N, K), np.uint8 if codebook is not None or keep_zeros else np.int8)
        s = np.empty((E, N, 1 if g == -1 else K // g), np.float32)
        if any(src.mins for src in sources):
            m = np.zeros(s.shape, np.float32)
        if keep_zeros:
            z = np.empty(s.shape, np.uint8)
        if any(src.act_order for src in sources) and not from_float:
            gi = np.empty((E, K), np.int32)
    elif scheme == "fp8_w8a16":
        q = np.empty((E, N, K), np.uint8)
        s = np.empty((E, -(-N // g[0]), -(-K // g[1])), np.float32)
    else:
        q, s = np.empty((E, N, K), np.uint16), None
    for e, eid in enumerate(ids):
        parts = first if e == 0 else last if e == E - 1 else [src.read(eid) for src in sources]
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
        if gi is not None:
            _set_g_idx(gi, e, eid, sources, parts, what)
        r0 = 0
        for src, p in zip(sources, parts):
            n = src.rows
            if scheme in INT_SCHEMES and p.scales.shape[1] != s.shape[2] and (gi is not None or p.zeros is not None):
                raise ValueError(f"{what}: {src.name} has groups of K / {p.scales.shape[1]}, which the stack "
                                 f"would split into K / {s.shape[2]}; zero points and g_idx need one group size")
            if scheme.startswith("int8") and p.codebook is not None:   # int4 indices widened to their int8 values
                q[e, r0:r0 + n] = np.asarray(p.codebook, np.int8)[p.q]
            elif scheme.startswith("int8") and p.zeros is not None:    # u - zero fits int8 (lossless)
                grp = np.arange(K) // (K // p.zeros.shape[1]) if p.g_idx is None else p.g_idx
                q[e, r0:r0 + n] = (p.q.astype(np.int16) - p.zeros[:, grp]).astype(np.int8)
            else:
                q[e, r0:r0 + n] = p.q
            if z is not None:
                z[e, r0:r0 + n] = p.zeros
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
    if z is not None and (z == 8).all():   # zero point 8 everywhere (GPTQ sym): symmetric int4, no zeros
        q, z = (q.astype(np.int16) - 8).astype(np.int8), None
    return Stack(scheme, g, q, s, m, z, gi, codebook)


def _set_g_idx(gi: np.ndarray, e: int, eid: int, sources: Sequence[Source], parts: Sequence[Part], what: str) -> None:
    """Expert e's g_idx: the same for every source of the stack (gate and up share their input)."""
    K = gi.shape[1]
    for src, p in zip(sources, parts):
        g = np.arange(K) // (K // p.scales.shape[1]) if p.g_idx is None else p.g_idx
        if src is sources[0]:
            gi[e] = g
        elif not np.array_equal(gi[e], g):
            raise ValueError(f"{what}: expert {eid}: {src.name} has a different g_idx from {sources[0].name}; "
                             "their act-order permutations must match to share one packed input order")


def pack_stack(st: Stack, what: str) -> PackedExperts:
    try:
        if st.scheme.startswith("int4"):
            return api.pack_int4(st.q, st.scales, group_size=st.group, zeros=st.zeros, codebook=st.codebook,
                                 mins=st.mins, g_idx=st.g_idx, scheme=st.scheme, act_block=st.act_block)
        if st.scheme.startswith("int8"):
            return api.pack_int8(st.q, st.scales, group_size=st.group, mins=st.mins, g_idx=st.g_idx,
                                 scheme=st.scheme, act_block=st.act_block)
        if st.act_block is not None:
            raise ValueError(f"act_block = {st.act_block}: activation blocks apply to the A8 schemes (int4_w4a8, "
                             f"int8_w8a8); {st.scheme} weights take none (pass None)")
        if st.scheme == "fp8_w8a16":
            return api.pack_fp8(st.q, st.scales, block_size=st.group)
        return api.pack_bf16(st.q)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
