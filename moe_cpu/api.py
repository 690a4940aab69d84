"""The moe_cpu Python API: packing, fused experts, shared expert, routing and dispatch control.

Every function checks its arguments in the C++ core and raises ``ValueError`` or ``TypeError``
naming the argument. Arrays are never converted or copied silently: pass C-contiguous arrays of
the documented dtypes. bfloat16 is ``ml_dtypes.bfloat16`` or raw ``uint16`` bits. Array arguments
may also be torch / JAX / other CPU tensors (DLPack, zero copy; results come back in their library:
``moe_cpu._dlpack``).
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np

from . import _core
from ._core import PackedExperts
from ._dlpack import accepts_dlpack
from ._dtypes import as_bits, is_named

__all__ = [
    "PackedExperts", "pack_int4", "pack_int8", "pack_fp8", "pack_bf16", "quantize_experts",
    "fused_experts", "shared_expert", "select_experts", "moe_align_block_size",
    "dynamic_4bit_int_moe", "load_packed", "set_num_threads", "get_num_threads", "compute_team", "set_scratch_limit", "get_scratch_limit", "cpu_features", "force_isa",
    "set_amx_min_rows", "get_amx_min_rows",
    "SCHEMES", "A8_SCHEMES", "A16_SCHEMES", "ACTIVATIONS", "ACT_BLOCKS",
]

SCHEMES = ("int4_w4a8", "int8_w8a8", "fp8_w8a16", "bf16", "int4_w4a16", "int8_w8a16")
# The int weight schemes by activations: A8 quantizes each token's activations to int8, A16 keeps 16 bits.
A8_SCHEMES = ("int4_w4a8", "int8_w8a8")
A16_SCHEMES = ("int4_w4a16", "int8_w8a16")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swiglustep", "swigluoai", "swigluoai_uninterleave")


def _bf16_bits(a: object) -> object:
    return as_bits(a, "bfloat16", np.uint16)


def _int_arg(v: object, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return int(v)


ACT_BLOCKS = (32, 64, 128, 256)


def _act_block_arg(act_block: object) -> int:
    """None (one activation scale per token) -> 0; else a positive int the core checks against K and the groups."""
    if act_block is None:
        return 0
    if isinstance(act_block, bool) or not isinstance(act_block, (int, np.integer)):
        raise TypeError(f"act_block must be an int in {ACT_BLOCKS} or None (one scale per token), "
                        f"got {type(act_block).__name__}")
    if int(act_block) not in ACT_BLOCKS:
        raise ValueError(f"act_block = {int(act_block)} is not supported: use one of {ACT_BLOCKS} "
                         "(dividing K), or None for one scale per token")
    return int(act_block)


def _codebook_arg(codebook: object) -> object:
    """A list / tuple of 16 ints -> int8 array (range-checked); arrays go to the core as they are."""
    if codebook is None or isinstance(codebook, np.ndarray):
        return codebook
    if not isinstance(codebook, (list, tuple)):
        raise TypeError(f"codebook must be an int8 array or a sequence of 16 ints, got {type(codebook).__name__}")
    vals = [_int_arg(v, "codebook entry") for v in codebook]
    bad = [v for v in vals if not -128 <= v <= 127]
    if bad:
        raise ValueError(f"codebook value {bad[0]} is outside the int8 range [-128, 127]")
    return np.array(vals, np.int8)


def _act_order(qweight: object, g_idx: object, group_size: int) -> Tuple[object, Optional[np.ndarray]]:
    """GPTQ act-order: (qweight with each expert's channels sorted by group, k_perm int32 [E, K]),
    or (qweight, None) without g_idx or when it is the identity (groups already contiguous)."""
    if g_idx is None or not isinstance(qweight, np.ndarray) or qweight.ndim != 3:
        return qweight, None   # without g_idx, or a qweight that the core reports
    E, N, K = qweight.shape
    if not isinstance(g_idx, np.ndarray) or g_idx.dtype.kind not in "iu":
        raise TypeError(f"g_idx must be an integer numpy array [E, K] or [K], got "
                        f"{getattr(g_idx, 'dtype', type(g_idx).__name__)}")
    if g_idx.shape == (K,):
        g_idx = np.broadcast_to(g_idx, (E, K))
    if g_idx.shape != (E, K):
        raise ValueError(f"g_idx has shape {list(g_idx.shape)} but [E={E}, K={K}] or [K] was expected")
    if not isinstance(group_size, int) or group_size <= 0 or K % group_size:
        raise ValueError(f"g_idx (act-order) needs a group_size > 0 that divides K = {K}, got {group_size}")
    G = K // group_size
    bad = np.argwhere((g_idx < 0) | (g_idx >= G))
    if len(bad):
        e, k = bad[0]
        raise ValueError(f"g_idx[{e}, {k}] = {g_idx[e, k]} is not a group index in [0, {G})")
    counts = np.zeros((E, G), np.int64)
    np.add.at(counts, (np.arange(E)[:, None], g_idx), 1)
    bad = np.argwhere(counts != group_size)
    if len(bad):
        e, gi = bad[0]
        raise ValueError(f"g_idx[{e}] is not a valid group map: group {gi} has {counts[e, gi]} input channels, "
                         f"every group must have group_size = {group_size}")
    perm = np.argsort(g_idx, axis=1, kind="stable").astype(np.int32)
    if (perm == np.arange(K, dtype=np.int32)).all():
        return qweight, None
    return np.take_along_axis(qweight, perm[:, None, :], axis=2), perm


@accepts_dlpack("qweight", "scales", "zeros", "codebook", "mins", "g_idx")
def pack_int4(qweight: np.ndarray, scales: np.ndarray, group_size: int = 128,
              zeros: Optional[np.ndarray] = None, *, codebook: object = None,
              mins: Optional[np.ndarray] = None, g_idx: Optional[np.ndarray] = None,
              scheme: str = "int4_w4a8", act_block: Optional[int] = None) -> PackedExperts:
    """Pack pre-quantized INT4 expert weights, run as W4A8 or W4A16.

    Args:
        qweight: int8 ``[E, N, K]`` with values in [-8, 7] (symmetric), or uint8 codes in [0, 15]
            when ``zeros`` or ``codebook`` is given.
        scales: float32 or bfloat16 ``[E, N, K // group_size]`` (``[E, N, 1]`` for per channel).
        group_size: a positive multiple of 16 (``int4_w4a16``: of 32) that divides K, or -1 for one scale per
            channel.
        zeros: optional uint8/int8 zero points ``[E, N, K // group_size]`` in [0, 15].
        codebook: optional int8 ``[16]`` (or 16 ints): the integer value of each 4-bit code, e.g.
            IQ4_NL's table, MXFP4's e2m1 values times 2, or ``range(16)`` for unsigned codes.
            Not with ``zeros``.
        mins: optional float32 ``[E, N, K // group_size]`` group offsets, subtracted after scaling.
        g_idx: optional int ``[E, K]`` (or ``[K]`` for all experts), GPTQ act-order: input channel k
            belongs to scale group ``g_idx[e, k]`` (each group holding group_size channels). The
            channels are sorted by group at pack time; ``fused_experts`` gathers the activations in
            that order (``form`` ends in ``+act_order``). ``unpack()`` / ``unpack_quantized()`` give
            the original channel order (and ``g_idx``). An identity map packs as without g_idx.
        scheme: "int4_w4a8" (each token's activations quantized to int8 at run time) or "int4_w4a16"
            (16-bit activations: int16 codes per token, what weight-only checkpoints such as GPTQ / AWQ
            were calibrated for; see docs/numerics.md).
        act_block: W4A8 only: one int8 activation scale per ``act_block`` channels of each token (32, 64, 128 or
            256, dividing K and nesting with the groups: dividing group_size or a multiple of it), as ggml's
            Q8_0 / Q8_K blocks; None (default): one scale per token. See docs/numerics.md.

    Returns:
        PackedExperts; the dequantized weight is ``value * scale - min``, with value = q (symmetric),
        q - zero (zero points) or codebook[q], and min = 0 without ``mins``.
    """
    g = _int_arg(group_size, "group_size")
    qweight, k_perm = _act_order(qweight, g_idx, g)
    return _core.pack_int4(qweight, _bf16_bits(scales), g, zeros,
                           _codebook_arg(codebook), None if mins is None else _bf16_bits(mins), k_perm,
                           _scheme_arg(scheme), _act_block_arg(act_block))


@accepts_dlpack("qweight", "scales", "mins", "g_idx")
def pack_int8(qweight: np.ndarray, scales: np.ndarray, group_size: int = -1, *,
              mins: Optional[np.ndarray] = None, g_idx: Optional[np.ndarray] = None,
              scheme: str = "int8_w8a8", act_block: Optional[int] = None) -> PackedExperts:
    """Pack INT8 expert weights, run as W8A8 (``scheme="int8_w8a8"``) or W8A16 (``"int8_w8a16"``). scales: float32 ``[E, N]`` or ``[E, N, 1]`` per channel,
    or ``[E, N, K // group_size]`` with a group size that divides K (16 for GGUF Q6_K).
    mins: optional float32 group offsets of the scales' shape; the weight is ``q * scale - min``.
    g_idx: optional act-order group map, as in ``pack_int4``.
    act_block: W8A8 activation blocks, as in ``pack_int4``."""
    g = _int_arg(group_size, "group_size")
    qweight, k_perm = _act_order(qweight, g_idx, g)
    return _core.pack_int8(qweight, _bf16_bits(scales), g, None if mins is None else _bf16_bits(mins), k_perm,
                           _scheme_arg(scheme), _act_block_arg(act_block))


def _scheme_arg(scheme: object) -> str:
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a str, one of {SCHEMES}, got {type(scheme).__name__}")
    return scheme


def _block(block_size: object) -> Tuple[int, int]:
    if not isinstance(block_size, (tuple, list)) or len(block_size) != 2:
        raise TypeError(f"block_size must be a pair (block_n, block_k), got {block_size!r}")
    return _int_arg(block_size[0], "block_size[0]"), _int_arg(block_size[1], "block_size[1]")


@accepts_dlpack("weight", "scale_inv")
def pack_fp8(weight: np.ndarray, scale_inv: np.ndarray,
             block_size: Tuple[int, int] = (128, 128)) -> PackedExperts:
    """Pack FP8 e4m3fn expert weights (W8A16) with one float32 scale per ``block_size`` block.

    Args:
        weight: uint8 bits or ``ml_dtypes.float8_e4m3fn``, ``[E, N, K]``; NaN codes are rejected.
        scale_inv: float32 ``[E, ceil(N / bn), ceil(K / bk)]``; it multiplies (DeepSeek-V3 style).
        block_size: ``(bn, bk)``; edge blocks may be partial.
    """
    bn, bk = _block(block_size)
    return _core.pack_fp8(as_bits(weight, "float8_e4m3fn", np.uint8), scale_inv, bn, bk)


@accepts_dlpack("weight")
def pack_bf16(weight: np.ndarray) -> PackedExperts:
    """Pack bfloat16 expert weights ``[E, N, K]`` (ml_dtypes.bfloat16 or uint16 bits).
    Use ``quantize_experts(w, "bf16")`` to round float32 weights."""
    return _core.pack_bf16(_bf16_bits(weight))


@accepts_dlpack("w")
def quantize_experts(w: np.ndarray, scheme: str, group_size: Optional[int] = None,
                     block_size: Tuple[int, int] = (128, 128), act_block: Optional[int] = None) -> PackedExperts:
    """Quantize float32 expert weights ``[E, N, K]`` and pack them.

    Rules (float32 arithmetic, round half to even; an all-zero group gets scale 1):
    int4 ``s = amax(group) / 7``, ``q = clamp(rint(w / s), -8, 7)``; int8 ``s = amax / 127``;
    fp8 ``s = amax(block) / 448`` and ``q = e4m3fn(w / s)``; bf16 rounds to nearest even.
    int4_w4a16 / int8_w8a16 quantize the weights as int4_w4a8 / int8_w8a8 and keep 16-bit activations.

    Args:
        scheme: "int4_w4a8", "int8_w8a8", "int4_w4a16", "int8_w8a16", "fp8_w8a16" or "bf16".
        group_size: int4 default 128, int8 default -1 (per channel); must be None for fp8 / bf16.
        block_size: fp8 ``(bn, bk)`` blocks.
        act_block: int4_w4a8 / int8_w8a8: activation blocks, as in ``pack_int4``; None: one scale per token.
    """
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a str, one of {SCHEMES}, got {type(scheme).__name__}")
    if scheme in ("fp8_w8a16", "bf16"):
        if group_size is not None:
            raise ValueError(f"group_size = {group_size} does not apply to scheme '{scheme}' "
                             "(fp8 uses block_size; bf16 has no scales); pass None")
        g = -1
    else:
        g = (128 if scheme.startswith("int4") else -1) if group_size is None else _int_arg(group_size, "group_size")
    bn, bk = _block(block_size)
    return _core.quantize_experts(w, scheme, g, bn, bk, _act_block_arg(act_block))


def _act_name(activation: object) -> str:
    name = getattr(activation, "moe_cpu_name", activation)
    if not isinstance(name, str):
        raise TypeError(f"activation must be a str (one of {ACTIVATIONS}) or a MoEActivation, "
                        f"got {type(activation).__name__}")
    return name


def _wrap_out(res: np.ndarray, like: np.ndarray) -> np.ndarray:
    return res.view(like.dtype) if is_named(like, "bfloat16") and res.dtype != like.dtype else res


@accepts_dlpack("hidden_states", "topk_weights", "topk_ids", "w13_bias", "w2_bias", "expert_map", "out",
                bf16_from="hidden_states")
def fused_experts(hidden_states: np.ndarray, w13: PackedExperts, w2: PackedExperts,
                  topk_weights: np.ndarray, topk_ids: np.ndarray, *, activation: str = "silu",
                  apply_router_weight_on_input: bool = False, w13_bias: Optional[np.ndarray] = None,
                  w2_bias: Optional[np.ndarray] = None, expert_map: Optional[np.ndarray] = None,
                  out: Optional[np.ndarray] = None, inplace: bool = False) -> np.ndarray:
    """Fused MoE experts: ``out[m] = sum_j w[m,j] * FFN_{ids[m,j]}(x[m])``.

    Args:
        hidden_states: ``[M, H]`` float32 or bfloat16 (ml_dtypes or uint16 bits).
        w13: PackedExperts ``[E, 2I, H]`` (rows [0, I) gate, [I, 2I) up).
        w2: PackedExperts ``[E, H, I]`` of the same scheme.
        topk_weights: float32 ``[M, k]``.
        topk_ids: int32 or int64 ``[M, k]``; ids < 0 are skipped, ids >= E raise.
        activation: one of ``ACTIVATIONS`` (or a ``MoEActivation``).
        apply_router_weight_on_input: scale each (token, expert) input row before quantization.
        w13_bias, w2_bias: float32 ``[E, 2I]`` and ``[E, H]``, added before the activation / router weight;
            the rows of the experts routed to must be finite (ValueError).
        expert_map: int32 ``[E_global]``, global id -> local id or -1 (ids are then global).
        out: optional output ``[M, H]`` of the input dtype; it may be ``hidden_states`` itself (as inplace) but
            must not otherwise share memory with an input (ValueError).
        inplace: write the result into ``hidden_states``.

    Returns:
        ``[M, H]`` array of the dtype of ``hidden_states`` (``out`` or ``hidden_states`` when given).
    """
    res = _core.fused_experts(_bf16_bits(hidden_states), w13, w2, topk_weights, topk_ids,
                              _act_name(activation), bool(apply_router_weight_on_input),
                              w13_bias, w2_bias, expert_map, _bf16_bits(out), bool(inplace))
    if out is not None:
        return out
    if inplace:
        return hidden_states
    return _wrap_out(res, hidden_states)


@accepts_dlpack("hidden_states", "fused_experts_out", "out", bf16_from="hidden_states")
def shared_expert(hidden_states: np.ndarray, w13: PackedExperts, w2: PackedExperts,
                  fused_experts_out: np.ndarray, routed_scaling_factor: float = 1.0, *,
                  out: Optional[np.ndarray] = None, inplace: bool = False) -> np.ndarray:
    """Add a dense SwiGLU shared expert: ``fused_experts_out * routed_scaling_factor + FFN(x)``.

    ``w13`` ``[1, 2I, H]`` and ``w2`` ``[1, H, I]`` are PackedExperts with one expert (any scheme).
    The sum is computed in fp32 and rounded once to the dtype of ``hidden_states``;
    ``inplace=True`` writes it into ``fused_experts_out`` (as SGLang's ``shared_expert_cpu``).
    """
    res = _core.shared_expert(_bf16_bits(hidden_states), w13, w2, _bf16_bits(fused_experts_out),
                              float(routed_scaling_factor), _bf16_bits(out), bool(inplace))
    if out is not None:
        return out
    if inplace:
        return fused_experts_out
    return _wrap_out(res, hidden_states)


@accepts_dlpack("router_logits", "e_score_correction_bias")
def select_experts(router_logits: np.ndarray, top_k: int, *, renormalize: bool = False,
                   scoring_func: str = "softmax", use_grouped_topk: bool = False,
                   num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
                   e_score_correction_bias: Optional[np.ndarray] = None,
                   routed_scaling_factor: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
    """Route tokens to experts as vLLM's CPU ``select_experts`` does.

    Args:
        router_logits: float32 ``[M, E]``.
        top_k: experts per token, in [1, E].
        renormalize: make each token's weights sum to 1 (softmax over the selected logits).
        scoring_func: "softmax" or "sigmoid".
        use_grouped_topk: DeepSeek-style grouped selection (needs num_expert_group, topk_group).
        e_score_correction_bias: float32 ``[E]``, added to the scores for selection only.
        routed_scaling_factor: multiplies the final weights (in every mode).

    Returns:
        ``(topk_weights float32 [M, k], topk_ids int32 [M, k])``, columns by descending selection
        score, ties to the lower expert index.
    """
    if use_grouped_topk and (num_expert_group is None or topk_group is None):
        raise ValueError("use_grouped_topk=True needs num_expert_group and topk_group")
    if not use_grouped_topk and (num_expert_group is not None or topk_group is not None):
        raise ValueError("num_expert_group / topk_group are given but use_grouped_topk=False")
    g = 0 if num_expert_group is None else _int_arg(num_expert_group, "num_expert_group")
    t = 0 if topk_group is None else _int_arg(topk_group, "topk_group")
    if not isinstance(scoring_func, str):
        raise TypeError("scoring_func must be 'softmax' or 'sigmoid'")
    return _core.select_experts(router_logits, _int_arg(top_k, "top_k"), bool(renormalize), scoring_func,
                                bool(use_grouped_topk), g, t, e_score_correction_bias,
                                float(routed_scaling_factor))


@accepts_dlpack("topk_ids")
def moe_align_block_size(topk_ids: np.ndarray, num_experts: int,
                         block_size: int) -> Tuple[np.ndarray, np.ndarray, int]:
    """Group the flattened (token, j) slots by expert, SGLang style.

    Returns ``(sorted_ids, expert_ids, num_tokens_post_pad)``: slot indices ``m * k + j`` in
    ascending expert then slot order, each expert's run padded to a multiple of ``block_size``
    with the value ``M * k``; ``expert_ids[b]`` is the expert of block ``b``. ids of -1 are dropped.
    """
    return _core.moe_align_block_size(topk_ids, _int_arg(num_experts, "num_experts"),
                                      _int_arg(block_size, "block_size"))


_KIND_TO_ACT = {0: "silu", 1: "swigluoai_uninterleave", 2: "silu"}


@accepts_dlpack("x", "topk_ids", "topk_weights", bf16_from="x")
def dynamic_4bit_int_moe(x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                         w13_packed: PackedExperts, w2_packed: PackedExperts, H: int, I: int, I2: int,
                         group_size: int, apply_router_weight_on_input: bool,
                         activation_kind: int) -> np.ndarray:
    """vLLM's ``dynamic_4bit_int_moe_cpu`` signature on int4_w4a8 PackedExperts.

    ``I2`` must equal ``2 * I``; ``H``, ``I`` and ``group_size`` must match the packed weights.
    ``activation_kind`` 0 and 2 compute ``silu``, 1 computes ``swigluoai_uninterleave``.
    """
    H, I, I2 = _int_arg(H, "H"), _int_arg(I, "I"), _int_arg(I2, "I2")
    kind, g = _int_arg(activation_kind, "activation_kind"), _int_arg(group_size, "group_size")
    if kind not in _KIND_TO_ACT:
        raise ValueError(f"activation_kind = {kind} is unknown (expected 0 = SwiGLU, 1 = SwiGLU-OAI, 2 = SiLU)")
    if I2 != 2 * I:
        raise ValueError(f"I2 = {I2} must equal 2 * I = {2 * I}")
    for name, w in (("w13_packed", w13_packed), ("w2_packed", w2_packed)):
        if not isinstance(w, PackedExperts):
            raise TypeError(f"{name} must be a PackedExperts, got {type(w).__name__}")
        if w.scheme != "int4_w4a8":
            raise ValueError(f"{name} is packed as {w.scheme}; dynamic_4bit_int_moe needs int4_w4a8")
        if w.group_size != g:
            raise ValueError(f"group_size = {g} does not match {name}.group_size = {w.group_size}")
    if (w13_packed.out_features, w13_packed.in_features) != (I2, H):
        raise ValueError(f"w13_packed is [E, {w13_packed.out_features}, {w13_packed.in_features}] "
                         f"but [E, I2={I2}, H={H}] was expected")
    if (w2_packed.out_features, w2_packed.in_features) != (H, I):
        raise ValueError(f"w2_packed is [E, {w2_packed.out_features}, {w2_packed.in_features}] "
                         f"but [E, H={H}, I={I}] was expected")
    return fused_experts(x, w13_packed, w2_packed, topk_weights, topk_ids, activation=_KIND_TO_ACT[kind],
                         apply_router_weight_on_input=apply_router_weight_on_input)


def load_packed(path: "str | os.PathLike[str]", mmap: bool = True, verify: bool = True) -> PackedExperts:
    """Load weights written by ``PackedExperts.save``.

    With ``mmap=True`` the file is mapped read-only and used in place (no copy; the mapping lives as
    long as the returned object). ``verify=True`` checks every section's CRC32 (it reads the whole
    file once). A wrong magic or version, a corrupted or truncated file, a header whose shapes do
    not match its sections, or a layout this build cannot run raises ``ValueError``. The kernel is
    chosen for this CPU at load time.
    """
    return _core.load_packed(os.fspath(path), bool(mmap), bool(verify))


def set_num_threads(n: int) -> None:
    """Set the number of threads of every call's compute team (default: OpenMP's default, i.e. ``OMP_NUM_THREADS``
    or the processors this process may run on).

    ``n`` must be in [1, 1024], or up to the machine's processor count where that is larger (ValueError). More
    threads than processors is allowed and only slows calls down (docs/threads.md).
    """
    _core.set_num_threads(_int_arg(n, "n"))


def get_num_threads() -> int:
    """The number of threads used by every call."""
    return _core.get_num_threads()


def compute_team() -> str:
    """Which compute team runs the parallel loops and how its idle threads wait, in words (docs/threads.md):
    moe_cpu's own team by default; OpenMP's with ``MOE_CPU_TEAM=omp`` or when ``OMP_PROC_BIND`` / ``OMP_PLACES``
    is set. ``MOE_CPU_SPIN_US`` sets how long idle workers poll before they sleep (default 200)."""
    return _core.compute_team()


def set_scratch_limit(nbytes: int) -> None:
    """Bound ``fused_experts``' scratch memory per calling thread (default 96 MiB). Tokens run in equal
    chunks that fit it; a larger limit gives each expert more rows per pass over its weights (faster
    prefill on models with many experts). With the SIMD kernels results do not depend on it (the
    Eigen reference kernels' float GEMMs may change in the last bits)."""
    _core.set_scratch_limit(_int_arg(nbytes, "nbytes"))


def get_scratch_limit() -> int:
    """The scratch bound in bytes (see ``set_scratch_limit``)."""
    return _core.get_scratch_limit()


def cpu_features() -> dict:
    """What the CPU has and what dispatch uses: ``{"detected": [...], "active": [...],
    "isa": forced level, "kernels": {scheme: kernel name chosen now}, "amx": "granted", why AMX is
    not used, or "emulated: ..." under the tests' SIGILL trap (tests/amx_trap; not a speed path), "amx_min_rows": rows an expert needs before the AMX kernels use tiles, "amx_min_rows_float": the same for
    bf16 and fp8, "amx_min_rows_set": whether ``set_amx_min_rows`` or ``MOE_CPU_AMX_MIN_ROWS`` set it (until
    then, bf16 and fp8 take the tiles from 8 rows; A16 and int4 / int8 in groups of 32 stay off them unless it is
    set to 1)}``."""
    return {
        "detected": list(_core.detected_features()),
        "active": list(_core.active_features()),
        "isa": _core.forced_isa(),
        "kernels": {s: _core.selected_kernel(s) for s in SCHEMES},
        "amx": _core.amx_status(),
        "amx_min_rows": _core.amx_min_rows(),
        "amx_min_rows_float": _core.amx_min_rows_float(),
        "amx_min_rows_set": _core.amx_min_rows_set(),
    }


def set_amx_min_rows(rows: Optional[int]) -> None:
    """Rows an expert needs before the AMX kernels use the tiles (fewer: their AVX-512 twins, with the same
    bits for the int schemes and fp32-rounding differences for bf16 / fp8). Overrides ``MOE_CPU_AMX_MIN_ROWS``;
    applies to later calls. No effect without AMX. The default, 16, was measured on an Emerald Rapids; there,
    bf16 and fp8 won from 8 rows, so until a threshold is set (here or by the variable) they take the tiles from
    8; once set, it applies to them too. A16 and int4 / int8 in groups of 32 (GGUF's forms) lost on the tiles at
    nearly every row count (0.3-1.1x; codebook and K-quant layers 2.2-4.8x slower), so they stay on AVX-512 at every
    threshold but 1, which puts every expert on the tiles (the tests' setting; docs/performance.md,
    "Xeon with AMX: when the tiles win (2 and 16 cores)").
    ``None`` goes back to ``MOE_CPU_AMX_MIN_ROWS`` or, without it, to the defaults
    (``cpu_features()["amx_min_rows_set"]`` False)."""
    if rows is None:
        _core.reset_amx_min_rows()
        return
    _core.set_amx_min_rows(_int_arg(rows, "rows"))


def get_amx_min_rows() -> int:
    """The AMX row threshold in force (see ``set_amx_min_rows``)."""
    return _core.amx_min_rows()


def force_isa(isa: str) -> None:
    """Restrict dispatch to an ISA level ("native", "reference", "avx2", "avx2vnni", "avx512", "avx512_novbmi",
    "amx", "amx_model", "neon", ...), like the ``MOE_CPU_ISA`` environment variable. Applies to weights packed
    afterwards. "avx512" excludes AMX; "amx_model" runs the AMX kernels on a scalar model of the tile
    registers on any x86 host (a test path, far slower)."""
    if not isinstance(isa, str):
        raise TypeError("isa must be a str")
    _core.force_isa(isa)
