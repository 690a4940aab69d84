"""A vLLM-compatible surface for moe_cpu that needs no PyTorch.

This module mirrors the small part of vLLM's fused-MoE interface that a CPU
INT4 W4A8 expert backend touches, so code written against vLLM's
``CPUExpertsInt4`` can run on moe_cpu with NumPy arrays and
:class:`moe_cpu.PackedExperts` weights:

* enums: :class:`MoEActivation`, :class:`RoutingMethodType`,
  :class:`FusedMoEActivationFormat` (same member names and values as vLLM);
* quantization descriptors: :class:`GroupShape`, :class:`ScaleDesc`,
  :class:`QuantKey` and the INT4 W4A8 keys (``kInt4W4A8Static*Sym``);
* configs: :class:`FusedMoEParallelConfig`, :class:`FusedMoEConfig`,
  :class:`FusedMoEQuantConfig` (vLLM's field names, only the fields moe_cpu
  uses);
* :class:`CPUExpertsInt4`, the monolithic expert class: capability checks,
  routing with :func:`moe_cpu.select_experts` and computation with
  :func:`moe_cpu.fused_experts`.

Dtypes are NumPy dtypes. ``"bfloat16"`` (or ``ml_dtypes.bfloat16``) names
bfloat16. Where moe_cpu behaves differently from vLLM, the docstring says so,
and ``docs/vllm_compat.md`` lists every difference.

The compute functions are looked up on the ``moe_cpu`` package when they are
called, so importing this module never depends on the native core.
"""

from __future__ import annotations

import importlib
import platform
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from types import ModuleType
from typing import Any, ClassVar, NamedTuple

import numpy as np

__all__ = [
    "MoEActivation",
    "RoutingMethodType",
    "FusedMoEActivationFormat",
    "GroupShape",
    "ScaleDesc",
    "QuantKey",
    "kInt4W4A8StaticGroup32Sym",
    "kInt4W4A8StaticGroup64Sym",
    "kInt4W4A8StaticGroup128Sym",
    "kInt4W4A8StaticGroupSym",
    "kInt4W4A8StaticChannelSym",
    "FusedMoEParallelConfig",
    "FusedMoEConfig",
    "FusedMoEQuantConfig",
    "make_w4a8_int8_moe_quant_config",
    "to_moe_cpu_activation",
    "CPUExpertsInt4",
]

DTypeLike = Any  # a NumPy dtype, a scalar type, ml_dtypes.bfloat16 or a dtype name


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

_BF16_NAMES = frozenset({"bfloat16", "bf16"})

_DTYPE_ABBREVIATIONS: dict[str, str] = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3fn",
    "int32": "i32",
    "int8": "i8",
    "uint8": "u8",
    "uint16": "u16",
}


def _bfloat16_dtype() -> np.dtype | str:
    """Return NumPy's bfloat16 dtype from ml_dtypes, or the name when ml_dtypes is absent."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is installed with moe_cpu
        return "bfloat16"
    return np.dtype(ml_dtypes.bfloat16)


def _canonical_dtype(dtype: DTypeLike) -> np.dtype | str:
    """Turn any spelling of a dtype into one canonical, hashable value.

    ``np.float32``, ``np.dtype("float32")`` and ``"float32"`` all become
    ``np.dtype("float32")``; ``"bfloat16"``, ``"bf16"`` and
    ``ml_dtypes.bfloat16`` all become the ml_dtypes bfloat16 dtype. This is
    what makes two :class:`ScaleDesc` or :class:`QuantKey` built from
    different spellings compare and hash equal.
    """
    if isinstance(dtype, str):
        name = dtype.strip().lower()
        if name.startswith("torch."):
            name = name[len("torch.") :]
        if name in _BF16_NAMES:
            return _bfloat16_dtype()
        try:
            return np.dtype(name)
        except TypeError as exc:
            raise ValueError(f"unknown dtype name {dtype!r}") from exc
    try:
        resolved = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(
            f"expected a NumPy dtype, a dtype name or ml_dtypes.bfloat16, got {dtype!r}"
        ) from exc
    if resolved.name in _BF16_NAMES:
        return _bfloat16_dtype()
    return resolved


def _dtype_name(dtype: np.dtype | str | None) -> str:
    """The plain name of a canonical dtype (``"float32"``, ``"bfloat16"``...)."""
    if dtype is None:
        return "None"
    return dtype if isinstance(dtype, str) else dtype.name


def _dtype_abbreviation(dtype: np.dtype | str) -> str:
    """A short name such as ``f32`` or ``bf16``, used in ``str()`` of keys."""
    name = _dtype_name(dtype)
    return _DTYPE_ABBREVIATIONS.get(name, name)


# ---------------------------------------------------------------------------
# Enums
# ---------------------------------------------------------------------------


class MoEActivation(Enum):
    """The activation applied between the two expert GEMMs (vLLM's names and values).

    Gated members take the ``[..., 2*I]`` output of GEMM1 (gate and up) and
    return ``[..., I]``; ``*_NO_MUL`` members keep the width. The gated members
    that moe_cpu computes map to its activation strings through
    :attr:`moe_cpu_name` (or :func:`to_moe_cpu_activation`): ``silu``, ``gelu``, ``gelu_tanh``,
    ``swigluoai`` (gpt-oss, gate and up interleaved), ``swigluoai_uninterleave``
    (the same math on the two halves) and ``swiglustep``.
    """

    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    RELU2 = "relu2"
    SWIGLUOAI = "swigluoai"
    SITU = "situ"
    SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"
    SWIGLUSTEP = "swiglustep"

    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"
    GELU_TANH_NO_MUL = "gelu_tanh_no_mul"
    RELU2_NO_MUL = "relu2_no_mul"

    @property
    def is_gated(self) -> bool:
        """True when the activation consumes a gate half and an up half (no ``_no_mul`` suffix)."""
        return not self.value.endswith("_no_mul")

    @property
    def moe_cpu_name(self) -> str:
        """moe_cpu's ``activation=`` string for this member (what :func:`moe_cpu.fused_experts` reads).

        Raises:
            ValueError: moe_cpu has no kernel for this activation.
        """
        return to_moe_cpu_activation(self)

    def without_mul(self) -> MoEActivation:
        """The non-gated counterpart (``SILU`` -> ``SILU_NO_MUL``), or ``self`` if there is none."""
        return _WITHOUT_MUL.get(self, self)

    @classmethod
    def from_str(cls, s: str) -> MoEActivation:
        """Parse an activation from its string value (``"gelu_pytorch_tanh"`` is read as ``gelu_tanh``).

        Raises:
            ValueError: the string names no member.
        """
        value = _ACTIVATION_ALIASES.get(s, s)
        for member in cls:
            if member.value == value:
                return member
        valid = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"unknown MoE activation {s!r}; valid activations: {valid}")


_ACTIVATION_ALIASES: dict[str, str] = {"gelu_pytorch_tanh": "gelu_tanh"}

_WITHOUT_MUL: dict[MoEActivation, MoEActivation] = {
    MoEActivation.SILU: MoEActivation.SILU_NO_MUL,
    MoEActivation.GELU: MoEActivation.GELU_NO_MUL,
    MoEActivation.GELU_TANH: MoEActivation.GELU_TANH_NO_MUL,
    MoEActivation.RELU2: MoEActivation.RELU2_NO_MUL,
}

# The vLLM activations that moe_cpu computes, and moe_cpu's name for each.
_MOE_CPU_ACTIVATIONS: dict[MoEActivation, str] = {
    MoEActivation.SILU: "silu",
    MoEActivation.GELU: "gelu",
    MoEActivation.GELU_TANH: "gelu_tanh",
    MoEActivation.SWIGLUOAI: "swigluoai",
    MoEActivation.SWIGLUOAI_UNINTERLEAVE: "swigluoai_uninterleave",
    MoEActivation.SWIGLUSTEP: "swiglustep",
}


def to_moe_cpu_activation(activation: MoEActivation | str) -> str:
    """Return the ``activation=`` string that :func:`moe_cpu.fused_experts` takes for ``activation``.

    Args:
        activation: a :class:`MoEActivation` or its string value.

    Returns:
        One of ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"swigluoai"``,
        ``"swigluoai_uninterleave"``, ``"swiglustep"``. The math of each is
        DESIGN.md section 5.

    Raises:
        ValueError: moe_cpu has no kernel for this activation (``relu2``,
            ``situ`` and the ``*_no_mul`` forms).
    """
    act = _as_activation(activation, "activation")
    try:
        return _MOE_CPU_ACTIVATIONS[act]
    except KeyError:
        supported = ", ".join(m.name for m in _MOE_CPU_ACTIVATIONS)
        raise ValueError(
            f"activation {act.name} ({act.value!r}) has no moe_cpu kernel; "
            f"supported: {supported}"
        ) from None


def _as_activation(activation: MoEActivation | str, arg_name: str) -> MoEActivation:
    """Accept a :class:`MoEActivation` or its string value; raise a clear error otherwise."""
    if isinstance(activation, MoEActivation):
        return activation
    if isinstance(activation, str):
        return MoEActivation.from_str(activation)
    raise TypeError(
        f"{arg_name} must be a MoEActivation or its string value, got {type(activation).__name__}"
    )


class RoutingMethodType(IntEnum):
    """How router logits become top-k weights (vLLM's member names and integer values).

    The values follow vLLM's ``fused_moe/config.py``, which keeps them in step
    with FlashInfer's TRT-LLM MoE runner (0-9) and adds values from 100 on for
    methods that are never passed to FlashInfer.
    """

    Default = 0
    """Softmax over all experts, then top-k (no renormalization)."""
    Renormalize = 1
    """Top-k of the logits, then softmax over the k selected."""
    DeepSeekV3 = 2
    """Sigmoid, correction bias, grouped top-k (DeepSeek-V3)."""
    Llama4 = 3
    """Top-1, then sigmoid (Llama 4)."""
    RenormalizeNaive = 4
    """Softmax, top-k, then divide by the sum of the k weights."""
    TopK = 5
    """Top-k only, no softmax."""
    SigmoidRenorm = 6
    """Sigmoid, top-k, renormalize by the sum of the k weights."""
    MiniMax2 = 7
    """Sigmoid plus bias, top-k, scaled sum normalization (MiniMax)."""
    Sigmoid = 8
    """Sigmoid, then top-k, no renormalization."""
    Unspecified = 9
    """No named method."""
    DeepseekV4 = 100
    """sqrt-softplus scores with bias and renormalization (DeepSeek-V4)."""
    Custom = 101
    """A model-specific routing function."""
    Simulated = 102
    """Synthetic routing, for testing and benchmarks."""


class FusedMoEActivationFormat(Enum):
    """Layout of the activations handed to the experts.

    ``Standard`` is ``[num_tokens, hidden_dim]``, the only format moe_cpu uses;
    ``BatchedExperts`` (``[num_experts, max_tokens, hidden_dim]``) exists for
    name compatibility.
    """

    Standard = "standard"
    BatchedExperts = "batched_experts"


# ---------------------------------------------------------------------------
# Quantization descriptors
# ---------------------------------------------------------------------------


class _GroupShapeBase(NamedTuple):
    row: int
    col: int


class GroupShape(_GroupShapeBase):
    """The block of elements that share one quantization scale, as ``(row, col)``.

    ``-1`` means the whole extent of that dimension. For a weight ``[N, K]``:
    ``(1, 32)`` is one scale per 32 input columns of a row (group-wise),
    ``(-1, 1)`` one scale per output channel (``PER_CHANNEL``); for activations
    ``(1, -1)`` is one scale per token (``PER_TOKEN``) and ``(-1, -1)`` one per
    tensor (``PER_TENSOR``). It is a tuple, so ``GroupShape(1, 32) == (1, 32)``.
    """

    __slots__ = ()

    PER_TENSOR: ClassVar[GroupShape]
    PER_TOKEN: ClassVar[GroupShape]
    PER_CHANNEL: ClassVar[GroupShape]

    def is_per_tensor(self) -> bool:
        """True for ``(-1, -1)``: a single scale."""
        return self.row == -1 and self.col == -1

    def is_per_token(self) -> bool:
        """True for ``(1, -1)``: one scale per row."""
        return self.row == 1 and self.col == -1

    def is_per_channel(self) -> bool:
        """True for ``(-1, 1)``: one scale per column of the transposed view (per output channel)."""
        return self.row == -1 and self.col == 1

    def is_per_group(self) -> bool:
        """True for ``(1, g)`` with ``g >= 1``: one scale per ``g`` consecutive columns of a row."""
        return self.row == 1 and self.col >= 1


GroupShape.PER_TENSOR = GroupShape(-1, -1)
GroupShape.PER_TOKEN = GroupShape(1, -1)
GroupShape.PER_CHANNEL = GroupShape(-1, 1)


def _as_group_shape(value: GroupShape | tuple[int, int] | list[int], arg_name: str) -> GroupShape:
    """Accept a GroupShape or a pair of ints."""
    if isinstance(value, GroupShape):
        return value
    try:
        row, col = value
    except (TypeError, ValueError):
        raise TypeError(f"{arg_name} must be a GroupShape or a (row, col) pair, got {value!r}") from None
    return GroupShape(int(row), int(col))


@dataclass(frozen=True)
class ScaleDesc:
    """Describes one quantization scale: its dtype, whether it is static, and its group shape.

    Attributes:
        dtype: dtype of the scale values (``np.float32``, ``"bfloat16"``...);
            stored in a canonical form so that every spelling compares equal.
        static: True for scales fixed ahead of time (weights), False for
            scales computed at run time (dynamic activation quantization).
        group_shape: the elements that share one scale.
    """

    dtype: DTypeLike
    static: bool
    group_shape: GroupShape

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _canonical_dtype(self.dtype))
        object.__setattr__(self, "static", bool(self.static))
        object.__setattr__(self, "group_shape", _as_group_shape(self.group_shape, "group_shape"))

    def __str__(self) -> str:
        names = {
            GroupShape.PER_TENSOR: "per_tensor",
            GroupShape.PER_TOKEN: "per_token",
            GroupShape.PER_CHANNEL: "per_channel",
        }
        shape = names.get(self.group_shape, f"({self.group_shape.row}, {self.group_shape.col})")
        kind = "static" if self.static else "dynamic"
        return f"{_dtype_abbreviation(self.dtype)},{kind},{shape}"


@dataclass(frozen=True)
class QuantKey:
    """Identifies a quantization type: quantized dtype, scale(s) and symmetry.

    Two keys are equal (and hash equal) when all fields are equal, which is
    how capability checks such as
    :meth:`CPUExpertsInt4._supports_quant_scheme` match them.

    Attributes:
        dtype: the quantized storage dtype (``np.int8`` for INT4 values kept
            one per byte, as vLLM does).
        scale: the first-level scale.
        scale2: an optional second-level scale (None for INT4 W4A8).
        symmetric: True when there is no zero point.
    """

    dtype: DTypeLike
    scale: ScaleDesc
    scale2: ScaleDesc | None = None
    symmetric: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _canonical_dtype(self.dtype))
        object.__setattr__(self, "symmetric", bool(self.symmetric))
        if not isinstance(self.scale, ScaleDesc):
            raise TypeError(f"scale must be a ScaleDesc, got {type(self.scale).__name__}")
        if self.scale2 is not None and not isinstance(self.scale2, ScaleDesc):
            raise TypeError(f"scale2 must be a ScaleDesc or None, got {type(self.scale2).__name__}")

    def __str__(self) -> str:
        second = f"scale2({self.scale2})," if self.scale2 is not None else ""
        sym = "symmetric" if self.symmetric else "asymmetric"
        return f"QuantKey({_dtype_abbreviation(self.dtype)},scale({self.scale}),{second}{sym})"


def _int4_w4a8_group_key(group_size: int) -> QuantKey:
    """The weight key of a group-wise INT4 W4A8 checkpoint.

    int8 storage, static bfloat16 scales, one per ``(1, group_size)`` block, symmetric.
    """
    return QuantKey(np.int8, ScaleDesc("bfloat16", True, GroupShape(1, group_size)), symmetric=True)


kInt4W4A8StaticGroup128Sym: QuantKey = _int4_w4a8_group_key(128)
"""INT4 weights (int8 storage), static bfloat16 scales, one per 128 input columns, symmetric."""

kInt4W4A8StaticGroup64Sym: QuantKey = _int4_w4a8_group_key(64)
"""INT4 weights (int8 storage), static bfloat16 scales, one per 64 input columns, symmetric."""

kInt4W4A8StaticGroup32Sym: QuantKey = _int4_w4a8_group_key(32)
"""INT4 weights (int8 storage), static bfloat16 scales, one per 32 input columns, symmetric."""

kInt4W4A8StaticGroupSym: QuantKey = _int4_w4a8_group_key(-1)
"""Group-wise INT4 weights whose group size is fixed at run time (group shape ``(1, -1)``)."""

kInt4W4A8StaticChannelSym: QuantKey = QuantKey(
    np.int8, ScaleDesc(np.float32, True, GroupShape.PER_CHANNEL), symmetric=True
)
"""INT4 weights (int8 storage), static float32 scales, one per output channel, symmetric."""


# ---------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------


@dataclass
class FusedMoEParallelConfig:
    """How the MoE layer is split across workers (vLLM's field names).

    moe_cpu itself does no communication: a caller that shards the layer
    passes each worker its own weights (and an ``expert_map`` under expert
    parallelism) and combines the partial outputs itself.

    Attributes:
        tp_size, tp_rank: tensor parallelism (intermediate dim split).
        pcp_size, pcp_rank: prefill context parallelism.
        dp_size, dp_rank: data parallelism.
        ep_size, ep_rank: expert parallelism (experts split).
        sp_size: sequence parallelism.
        use_ep: whether experts are split (``ep_size > 1`` implies it).
        all2all_backend: name of the token dispatch backend (informational).
        enable_eplb: expert-parallel load balancing (not supported by moe_cpu).
    """

    tp_size: int = 1
    pcp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    tp_rank: int = 0
    pcp_rank: int = 0
    dp_rank: int = 0
    ep_rank: int = 0
    sp_size: int = 1
    use_ep: bool = False
    all2all_backend: str = "allgather_reducescatter"
    enable_eplb: bool = False

    @property
    def is_sequence_parallel(self) -> bool:
        """True when ``sp_size > 1``."""
        return self.sp_size > 1

    @classmethod
    def make_no_parallel(cls) -> FusedMoEParallelConfig:
        """A single-worker configuration: every size 1, every rank 0, no EP."""
        return cls()


@dataclass
class FusedMoEConfig:
    """Shape and behaviour of one MoE layer (vLLM's field names, the subset moe_cpu uses).

    Attributes:
        num_experts: global number of experts (the width of the router logits).
        experts_per_token: top-k.
        hidden_dim: H, the model dimension.
        intermediate_size: I of the whole layer; each tensor-parallel worker
            holds ``intermediate_size_per_partition = intermediate_size // tp_size``.
        num_local_experts: experts held by this worker; defaults to
            ``num_experts // ep_size``.
        activation: the activation between the GEMMs (a member or its string).
        routing_method: how logits become weights (a member or its int value).
        moe_parallel_config: the parallel layout; defaults to no parallelism.
        in_dtype: dtype of the hidden states and of the output
            (``np.float32`` or ``"bfloat16"`` for moe_cpu).
        router_logits_dtype: dtype of the router logits; defaults to ``in_dtype``.
        has_bias: whether the experts carry biases (passed through
            :class:`FusedMoEQuantConfig` ``w1_bias``/``w2_bias``).
        is_lora_enabled: LoRA on the experts (not supported by moe_cpu).
        device: always ``"cpu"``.
        intermediate_size_per_partition: derived, see ``intermediate_size``.

    Raises:
        ValueError: from ``__post_init__`` when sizes are inconsistent.
    """

    num_experts: int
    experts_per_token: int
    hidden_dim: int
    intermediate_size: int
    num_local_experts: int | None = None
    activation: MoEActivation = MoEActivation.SILU
    routing_method: RoutingMethodType = RoutingMethodType.Default
    moe_parallel_config: FusedMoEParallelConfig = field(default_factory=FusedMoEParallelConfig)
    in_dtype: DTypeLike = np.float32
    router_logits_dtype: DTypeLike | None = None
    has_bias: bool = False
    is_lora_enabled: bool = False
    device: str = "cpu"
    intermediate_size_per_partition: int = field(default=-1)

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "hidden_dim", "intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            setattr(self, name, int(value))
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}"
            )
        self.activation = _as_activation(self.activation, "activation")
        try:
            self.routing_method = RoutingMethodType(self.routing_method)
        except ValueError:
            raise ValueError(f"routing_method={self.routing_method!r} is not a RoutingMethodType") from None
        parallel = self.moe_parallel_config
        if not isinstance(parallel, FusedMoEParallelConfig):
            raise TypeError(
                f"moe_parallel_config must be a FusedMoEParallelConfig, got {type(parallel).__name__}"
            )
        if parallel.tp_size < 1 or self.intermediate_size % parallel.tp_size != 0:
            raise ValueError(
                f"intermediate_size={self.intermediate_size} must be divisible by "
                f"moe_parallel_config.tp_size={parallel.tp_size}"
            )
        per_partition = self.intermediate_size // parallel.tp_size
        if self.intermediate_size_per_partition not in (-1, per_partition):
            raise ValueError(
                f"intermediate_size_per_partition={self.intermediate_size_per_partition} does not equal "
                f"intermediate_size // tp_size = {per_partition}; leave it unset"
            )
        self.intermediate_size_per_partition = per_partition
        if self.num_local_experts is None:
            if parallel.ep_size < 1 or self.num_experts % parallel.ep_size != 0:
                raise ValueError(
                    f"num_experts={self.num_experts} is not divisible by ep_size={parallel.ep_size}; "
                    "pass num_local_experts explicitly"
                )
            self.num_local_experts = self.num_experts // parallel.ep_size
        self.in_dtype = _canonical_dtype(self.in_dtype)
        self.router_logits_dtype = (
            self.in_dtype if self.router_logits_dtype is None else _canonical_dtype(self.router_logits_dtype)
        )

    @property
    def is_act_and_mul(self) -> bool:
        """True for gated activations (GEMM1 produces gate and up, ``2*I`` rows)."""
        return self.activation.is_gated

    @property
    def tp_size(self) -> int:
        """Tensor-parallel size of ``moe_parallel_config``."""
        return self.moe_parallel_config.tp_size

    @property
    def dp_size(self) -> int:
        """Data-parallel size of ``moe_parallel_config``."""
        return self.moe_parallel_config.dp_size

    @property
    def ep_size(self) -> int:
        """Expert-parallel size of ``moe_parallel_config``."""
        return self.moe_parallel_config.ep_size

    @property
    def tp_rank(self) -> int:
        """Tensor-parallel rank of ``moe_parallel_config``."""
        return self.moe_parallel_config.tp_rank

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank of ``moe_parallel_config``."""
        return self.moe_parallel_config.dp_rank

    @property
    def ep_rank(self) -> int:
        """Expert-parallel rank of ``moe_parallel_config``."""
        return self.moe_parallel_config.ep_rank

    @property
    def use_ep(self) -> bool:
        """Whether experts are split across workers."""
        return self.moe_parallel_config.use_ep


@dataclass
class FusedMoEQuantConfig:
    """Quantization of one MoE layer, in the terms vLLM's experts classes read.

    vLLM keeps four quantization descriptors (``_a1``, ``_a2``, ``_w1``,
    ``_w2``); this class keeps the facts derived from them that an INT4 W4A8
    backend reads, under the same property names.

    Attributes:
        weight_key: the :class:`QuantKey` of the expert weights, or None.
        activation_key: the :class:`QuantKey` of the inputs; None means the
            inputs arrive unquantized (W4A8 quantizes them inside the kernel).
        block_shape: ``[row, col]`` of a weight quantization block:
            ``[1, g]`` group-wise, ``[-1, 1]`` per channel, None for per channel too.
        per_act_token_quant: activations quantized per token.
        per_out_ch_quant: weights quantized per output channel.
        w1_bias: optional float32 ``[E, 2*I]`` bias of GEMM1.
        w2_bias: optional float32 ``[E, H]`` bias of GEMM2.

    Raises:
        ValueError: ``per_act_token_quant`` together with a ``block_shape``
            (as in vLLM), or a malformed ``block_shape``.
    """

    weight_key: QuantKey | None = None
    activation_key: QuantKey | None = None
    block_shape: list[int] | None = None
    per_act_token_quant: bool = False
    per_out_ch_quant: bool = False
    w1_bias: np.ndarray | None = field(default=None, compare=False)
    w2_bias: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.block_shape is not None:
            try:
                row, col = (int(v) for v in self.block_shape)
            except (TypeError, ValueError):
                raise ValueError(
                    f"block_shape must be a [row, col] pair of ints, got {self.block_shape!r}"
                ) from None
            self.block_shape = [row, col]
        if self.per_act_token_quant and self.block_shape is not None:
            raise ValueError("per_act_token_quant cannot be combined with a block_shape")
        for name in ("weight_key", "activation_key"):
            key = getattr(self, name)
            if key is not None and not isinstance(key, QuantKey):
                raise TypeError(f"{name} must be a QuantKey or None, got {type(key).__name__}")

    @property
    def is_per_act_token(self) -> bool:
        """True when activations are quantized per token (``per_act_token_quant``)."""
        return self.per_act_token_quant

    @property
    def is_block_quantized(self) -> bool:
        """True when a ``block_shape`` is set."""
        return self.block_shape is not None

    @property
    def quant_dtype(self) -> np.dtype | str | None:
        """dtype of the quantized inputs, None when inputs are unquantized."""
        return None if self.activation_key is None else self.activation_key.dtype

    @property
    def weight_quant_dtype(self) -> np.dtype | str | None:
        """dtype of the quantized weights, None when unknown."""
        return None if self.weight_key is None else self.weight_key.dtype

    @property
    def is_quantized(self) -> bool:
        """True when the inputs are quantized before the experts (never for W4A8)."""
        return self.quant_dtype is not None

    @property
    def group_size(self) -> int:
        """The INT4 group size these settings describe: ``block_shape[1]``, or -1 per channel.

        Per channel (-1) when ``per_act_token_quant`` is set, when
        ``block_shape`` is None or when it is ``[-1, 1]``.
        """
        if self.per_act_token_quant or self.block_shape is None or self.block_shape == [-1, 1]:
            return -1
        return self.block_shape[1]


def make_w4a8_int8_moe_quant_config(
    block_shape: tuple[int, int] | list[int] | None = None,
    w1_bias: np.ndarray | None = None,
    w2_bias: np.ndarray | None = None,
) -> FusedMoEQuantConfig:
    """Build the :class:`FusedMoEQuantConfig` of an INT4 W4A8 layer.

    Args:
        block_shape: ``(1, g)`` for group-wise weights, ``(-1, 1)`` or None
            for per-channel weights (vLLM's convention).
        w1_bias: optional float32 ``[E, 2*I]`` bias of GEMM1.
        w2_bias: optional float32 ``[E, H]`` bias of GEMM2.

    Returns:
        A config whose ``weight_key`` is the key a compressed-tensors W4A8
        checkpoint of that layout produces (bfloat16 scales per group, float32
        per channel) and whose ``activation_key`` is None (inputs are quantized
        dynamically inside the kernel).
    """
    if block_shape is None or list(block_shape) == [-1, 1]:
        weight_key = kInt4W4A8StaticChannelSym
        shape: list[int] | None = [-1, 1]
    else:
        row, col = (int(v) for v in block_shape)
        weight_key = _int4_w4a8_group_key(col)
        shape = [row, col]
    return FusedMoEQuantConfig(
        weight_key=weight_key,
        activation_key=None,
        block_shape=shape,
        w1_bias=w1_bias,
        w2_bias=w2_bias,
    )


# ---------------------------------------------------------------------------
# The experts class
# ---------------------------------------------------------------------------

_SUPPORTED_W_A: tuple[tuple[QuantKey, QuantKey | None], ...] = (
    (kInt4W4A8StaticChannelSym, None),
    (kInt4W4A8StaticGroup128Sym, None),
    (kInt4W4A8StaticGroup64Sym, None),
    (kInt4W4A8StaticGroup32Sym, None),
    (kInt4W4A8StaticGroupSym, None),
)

_SUPPORTED_ROUTING = (
    RoutingMethodType.Default,
    RoutingMethodType.Renormalize,
    RoutingMethodType.RenormalizeNaive,
)

_RENORMALIZING_ROUTING = (RoutingMethodType.Renormalize, RoutingMethodType.RenormalizeNaive)

_SUPPORTED_ACTIVATIONS = (MoEActivation.SILU, MoEActivation.SWIGLUOAI, MoEActivation.SWIGLUSTEP)


def _core() -> ModuleType:
    """The ``moe_cpu`` package, imported when first needed (keeps import order free)."""
    return importlib.import_module(__package__ or "moe_cpu")


def _not_supported(what: str) -> tuple[bool, str]:
    return False, f"kernel does not support {what}"


def _is_float32_or_bf16(dtype: np.dtype | str | None) -> bool:
    return _dtype_name(dtype) in ("float32", "bfloat16")


class CPUExpertsInt4:
    """INT4-weight, INT8-activation (W4A8) monolithic MoE experts on the CPU.

    The drop-in counterpart of vLLM's ``CPUExpertsInt4``: :meth:`apply` takes
    router logits, routes with :func:`moe_cpu.select_experts` and computes the
    experts with :func:`moe_cpu.fused_experts` on ``int4_w4a8``
    :class:`moe_cpu.PackedExperts`, quantizing the activations per row inside
    the kernel. Unlike vLLM's class it runs on x86-64 and AArch64 alike,
    supports expert parallelism through ``expert_map``, passes expert biases
    from the quant config, and computes ``swiglustep`` and gpt-oss
    ``swigluoai`` exactly as DESIGN.md section 5 defines them.

    Args:
        moe_config: the layer's :class:`FusedMoEConfig`.
        quant_config: the layer's :class:`FusedMoEQuantConfig` (see
            :func:`make_w4a8_int8_moe_quant_config`).
    """

    def __init__(self, moe_config: FusedMoEConfig, quant_config: FusedMoEQuantConfig) -> None:
        if not isinstance(moe_config, FusedMoEConfig):
            raise TypeError(f"moe_config must be a FusedMoEConfig, got {type(moe_config).__name__}")
        if not isinstance(quant_config, FusedMoEQuantConfig):
            raise TypeError(
                f"quant_config must be a FusedMoEQuantConfig, got {type(quant_config).__name__}"
            )
        self.moe_config = moe_config
        self.quant_config = quant_config

    # -- properties of the class -------------------------------------------

    @property
    def expects_unquantized_inputs(self) -> bool:
        """True: the kernel quantizes the float inputs itself (dynamic per-row int8)."""
        return True

    @staticmethod
    def activation_format() -> FusedMoEActivationFormat:
        """The input layout :meth:`apply` takes: ``Standard`` (``[num_tokens, hidden_dim]``)."""
        return FusedMoEActivationFormat.Standard

    @staticmethod
    def is_monolithic() -> bool:
        """True: :meth:`apply` takes router logits and does the routing itself."""
        return True

    def supports_expert_map(self) -> bool:
        """True: ``expert_map`` (global id -> local id or -1) is honoured (vLLM's class returns False)."""
        return True

    @staticmethod
    def supports_lora() -> bool:
        """False: LoRA adapters on the experts are not supported."""
        return False

    # -- capability checks ----------------------------------------------------

    @staticmethod
    def _supports_current_device() -> bool:
        """True on any CPU.

        The kernel is chosen at pack time from the CPU's features (AVX-512,
        AVX2, NEON, ...), with a portable reference kernel as the fallback, so
        every machine that imports moe_cpu can run it; x86-64 and AArch64 are
        the tested targets. vLLM's class accepts only Arm CPUs.
        """
        return True

    @staticmethod
    def _supports_no_act_and_mul() -> bool:
        """False: a gated activation (gate and up halves) is required."""
        return False

    @staticmethod
    def _supports_activation(activation: MoEActivation) -> bool:
        """True for SILU, SWIGLUOAI and SWIGLUSTEP (the set vLLM's class accepts)."""
        return activation in _SUPPORTED_ACTIVATIONS

    @staticmethod
    def _supports_parallel_config(moe_parallel_config: FusedMoEParallelConfig) -> bool:
        """True for every consistent parallel layout, expert parallelism included.

        Expert parallelism works through ``expert_map`` (vLLM's class requires
        ``ep_size == 1``). Tensor, data and sequence parallelism need nothing
        from the kernel: each worker computes its own shard and the caller
        combines the results. Rejected: sizes below 1, ranks outside
        ``[0, size)``, ``ep_size > 1`` without ``use_ep``, and EPLB.
        """
        cfg = moe_parallel_config
        pairs = (
            (cfg.tp_size, cfg.tp_rank),
            (cfg.pcp_size, cfg.pcp_rank),
            (cfg.dp_size, cfg.dp_rank),
            (cfg.ep_size, cfg.ep_rank),
        )
        if cfg.sp_size < 1 or any(size < 1 or not 0 <= rank < size for size, rank in pairs):
            return False
        if cfg.ep_size > 1 and not cfg.use_ep:
            return False
        return not cfg.enable_eplb

    @staticmethod
    def _supports_quant_scheme(weight_key: QuantKey | None, activation_key: QuantKey | None) -> bool:
        """True for INT4 W4A8 weights with unquantized inputs.

        Accepted ``(weight_key, activation_key)`` pairs: the group keys
        ``kInt4W4A8StaticGroup{32,64,128}Sym``, the generic
        ``kInt4W4A8StaticGroupSym`` and the per-channel
        ``kInt4W4A8StaticChannelSym``, each with ``activation_key=None``.
        """
        return (weight_key, activation_key) in _SUPPORTED_W_A

    @staticmethod
    def _supports_routing_method(
        routing_method: RoutingMethodType,
        weight_key: QuantKey | None,
        activation_key: QuantKey | None,
    ) -> bool:
        """True for Default, Renormalize and RenormalizeNaive (softmax routing)."""
        return routing_method in _SUPPORTED_ROUTING

    @staticmethod
    def _supports_router_logits_dtype(
        router_logits_dtype: DTypeLike | None,
        routing_method: RoutingMethodType,
    ) -> bool:
        """True: any float dtype is accepted; logits are routed in float32."""
        return True

    @staticmethod
    def _supports_shape(hidden_dim: int) -> bool:
        """True: any hidden size (group divisibility is checked in :meth:`is_supported_config`)."""
        return True

    @staticmethod
    def _supports_batch_invariance() -> bool:
        """True: each row is quantized and reduced on its own, in a fixed order.

        A token's output does not depend on the other tokens of the batch
        (nor on the thread count), which the tests check bit for bit.
        """
        return True

    @staticmethod
    def is_supported_config(
        cls: type[CPUExpertsInt4],
        moe_config: FusedMoEConfig,
        weight_key: QuantKey | None,
        activation_key: QuantKey | None,
        activation_format: FusedMoEActivationFormat,
    ) -> tuple[bool, str | None]:
        """Say whether ``cls`` can run a layer, and why not when it cannot.

        Called as in vLLM's kernel oracle,
        ``cls.is_supported_config(cls, moe_config, weight_key, activation_key, activation_format)``.
        The checks run in vLLM's order (device, act-and-mul, activation,
        quantization scheme, parallel config, routing method, router logits
        dtype, shape, activation format, LoRA), after a check of the
        input dtype and followed by one that the group size divides both
        GEMM reduction dimensions.

        Returns:
            ``(True, None)``, or ``(False, reason)`` where reason starts with
            ``"kernel does not support"``.
        """
        if not _is_float32_or_bf16(moe_config.in_dtype):
            return _not_supported(f"{_dtype_name(moe_config.in_dtype)} input/output dtype")
        if not cls._supports_current_device():
            return _not_supported(f"current device {platform.machine() or 'unknown'}")
        if not (moe_config.is_act_and_mul or cls._supports_no_act_and_mul()):
            return _not_supported("no act_and_mul MLP layer")
        if not cls._supports_activation(moe_config.activation):
            return _not_supported(f"{moe_config.activation} activation")
        if not cls._supports_quant_scheme(weight_key, activation_key):
            return _not_supported(f"quantization scheme {weight_key}x{activation_key}")
        if not cls._supports_parallel_config(moe_config.moe_parallel_config):
            return _not_supported(f"parallel config {moe_config.moe_parallel_config}")
        if not cls._supports_routing_method(moe_config.routing_method, weight_key, activation_key):
            return _not_supported(f"routing method {moe_config.routing_method!r}")
        if not cls._supports_router_logits_dtype(moe_config.router_logits_dtype, moe_config.routing_method):
            return _not_supported(f"router logits dtype {_dtype_name(moe_config.router_logits_dtype)}")
        if not cls._supports_shape(moe_config.hidden_dim):
            return _not_supported(f"hidden dim {moe_config.hidden_dim}")
        if activation_format != cls.activation_format():
            fmt = getattr(activation_format, "value", activation_format)
            return _not_supported(f"{fmt} activation format")
        if moe_config.is_lora_enabled and not cls.supports_lora():
            return _not_supported("LoRA")
        if weight_key is not None and weight_key.scale.group_shape.is_per_group():
            group_size = weight_key.scale.group_shape.col
            for name, dim in (
                ("hidden_dim", moe_config.hidden_dim),
                ("intermediate_size_per_partition", moe_config.intermediate_size_per_partition),
            ):
                if dim % group_size != 0:
                    return _not_supported(
                        f"{name}={dim} with group size {group_size} (it must be a multiple of the group size)"
                    )
        return True, None

    # -- computation ------------------------------------------------------------

    @staticmethod
    def _activation_kind(activation: MoEActivation) -> int:
        """The ``activation_kind`` integer of vLLM's ``dynamic_4bit_int_moe`` kernel.

        SWIGLUSTEP -> 0, SWIGLUOAI -> 1, SILU -> 2, as vLLM maps them. This is
        only what :func:`moe_cpu.dynamic_4bit_int_moe` takes; :meth:`apply`
        does not use it (it computes the activation by name, see the class
        docstring).

        Raises:
            ValueError: any other activation.
        """
        if activation == MoEActivation.SWIGLUSTEP:
            return 0
        if activation == MoEActivation.SWIGLUOAI:
            return 1
        if activation == MoEActivation.SILU:
            return 2
        name = activation.name if isinstance(activation, MoEActivation) else repr(activation)
        raise ValueError(
            f"activation {name} has no dynamic_4bit_int_moe activation_kind "
            "(only SWIGLUSTEP -> 0, SWIGLUOAI -> 1, SILU -> 2)"
        )

    def _expected_group_size(self) -> int:
        """Group size the quant config asks for: ``block_shape[1]``, or -1 for per channel."""
        return self.quant_config.group_size

    def _check_apply_inputs(
        self,
        hidden_states: np.ndarray,
        w1: Any,
        w2: Any,
        router_logits: np.ndarray,
        global_num_experts: int,
        expert_map: np.ndarray | None,
        e_score_correction_bias: np.ndarray | None,
    ) -> None:
        """Validate the arguments of :meth:`apply` and raise errors that name the argument."""
        cfg = self.moe_config
        if not isinstance(hidden_states, np.ndarray):
            raise TypeError(f"hidden_states must be a numpy.ndarray, got {type(hidden_states).__name__}")
        if hidden_states.ndim != 2:
            raise ValueError(
                f"hidden_states must be 2-D [num_tokens, hidden_dim], got shape {hidden_states.shape}"
            )
        num_tokens, hidden = hidden_states.shape
        if hidden != cfg.hidden_dim:
            raise ValueError(
                f"hidden_states has {hidden} columns but moe_config.hidden_dim is {cfg.hidden_dim}"
            )
        if not isinstance(router_logits, np.ndarray):
            raise TypeError(f"router_logits must be a numpy.ndarray, got {type(router_logits).__name__}")
        if isinstance(global_num_experts, bool) or not isinstance(global_num_experts, (int, np.integer)):
            raise TypeError(f"global_num_experts must be an int, got {type(global_num_experts).__name__}")
        if global_num_experts < 1:
            raise ValueError(f"global_num_experts must be >= 1, got {global_num_experts}")
        if router_logits.shape != (num_tokens, global_num_experts):
            raise ValueError(
                f"router_logits has shape {router_logits.shape}, expected "
                f"({num_tokens}, {global_num_experts}) = (hidden_states rows, global_num_experts)"
            )
        if not np.issubdtype(router_logits.dtype, np.floating) and router_logits.dtype.name != "bfloat16":
            raise TypeError(f"router_logits must hold floats, got dtype {router_logits.dtype}")

        inter = cfg.intermediate_size_per_partition
        group = self._expected_group_size()
        for name, w, (n, k) in (("w1", w1, (2 * inter, cfg.hidden_dim)), ("w2", w2, (cfg.hidden_dim, inter))):
            scheme = getattr(w, "scheme", None)
            if scheme is None or not hasattr(w, "num_experts"):
                raise TypeError(
                    f"{name} must be a moe_cpu.PackedExperts (int4_w4a8), got {type(w).__name__}; "
                    "pack weights with moe_cpu.quantize_experts(w, 'int4_w4a8') or moe_cpu.pack_int4"
                )
            if scheme != "int4_w4a8":
                raise ValueError(f"{name} is packed as {scheme!r}; CPUExpertsInt4 needs 'int4_w4a8'")
            if (w.out_features, w.in_features) != (n, k):
                raise ValueError(
                    f"{name} has [N, K] = [{w.out_features}, {w.in_features}] per expert, expected "
                    f"[{n}, {k}] from moe_config (hidden_dim={cfg.hidden_dim}, "
                    f"intermediate_size_per_partition={inter})"
                )
            if w.group_size != group:
                raise ValueError(
                    f"{name} was packed with group_size={w.group_size} but quant_config asks for "
                    f"{group} (block_shape={self.quant_config.block_shape}, "
                    f"per_act_token_quant={self.quant_config.per_act_token_quant})"
                )
        if w1.num_experts != w2.num_experts:
            raise ValueError(f"w1 holds {w1.num_experts} experts but w2 holds {w2.num_experts}")

        if expert_map is None:
            if w1.num_experts != global_num_experts:
                raise ValueError(
                    f"w1 holds {w1.num_experts} experts but global_num_experts is {global_num_experts}; "
                    "pass an expert_map when the weights hold only this worker's experts"
                )
        else:
            if not isinstance(expert_map, np.ndarray):
                raise TypeError(
                    f"expert_map must be a numpy.ndarray or None, got {type(expert_map).__name__}"
                )
            if expert_map.shape != (global_num_experts,):
                raise ValueError(
                    f"expert_map has shape {expert_map.shape}, "
                    f"expected ({global_num_experts},) = (global_num_experts,)"
                )
            if not np.issubdtype(expert_map.dtype, np.integer):
                raise TypeError(f"expert_map must hold integers, got dtype {expert_map.dtype}")
        if e_score_correction_bias is not None:
            if not isinstance(e_score_correction_bias, np.ndarray):
                raise TypeError(
                    "e_score_correction_bias must be a numpy.ndarray or None, "
                    f"got {type(e_score_correction_bias).__name__}"
                )
            if e_score_correction_bias.shape != (global_num_experts,):
                raise ValueError(
                    f"e_score_correction_bias has shape {e_score_correction_bias.shape}, "
                    f"expected ({global_num_experts},) = (global_num_experts,)"
                )

    def apply(
        self,
        hidden_states: np.ndarray,
        w1: Any,
        w2: Any,
        router_logits: np.ndarray,
        activation: MoEActivation,
        global_num_experts: int,
        expert_map: np.ndarray | None,
        a1q_scale: np.ndarray | None,
        apply_router_weight_on_input: bool,
        num_expert_group: int | None = None,
        e_score_correction_bias: np.ndarray | None = None,
        routed_scaling_factor: float | None = None,
        topk_group: int | None = None,
    ) -> np.ndarray:
        """Route the tokens and run the INT4 W4A8 experts (the monolithic forward pass).

        Routing follows vLLM's class: softmax scoring, renormalization when
        ``moe_config.routing_method`` is Renormalize or RenormalizeNaive,
        grouped top-k when ``num_expert_group`` is given, top-k
        ``moe_config.experts_per_token``. The experts are then computed by
        :func:`moe_cpu.fused_experts` with the activation DESIGN.md section 5
        defines for its name (SILU -> ``silu``, SWIGLUSTEP -> ``swiglustep``,
        SWIGLUOAI -> gpt-oss ``swigluoai`` with gate and up interleaved).

        Args:
            hidden_states: float32 or bfloat16 ``[M, hidden_dim]``.
            w1: ``int4_w4a8`` PackedExperts ``[E_local, 2*I, hidden_dim]``
                (gate rows then up rows; interleaved for SWIGLUOAI).
            w2: ``int4_w4a8`` PackedExperts ``[E_local, hidden_dim, I]``.
            router_logits: ``[M, global_num_experts]`` of any float dtype; converted
                to C-contiguous float32 for routing (exact for bf16 and fp16).
            activation: SILU, SWIGLUOAI or SWIGLUSTEP (member or string value).
            global_num_experts: number of experts across all workers.
            expert_map: None, or integers ``[global_num_experts]`` (converted to
                int32) mapping a global expert id to this worker's local id, or
                -1 for experts held elsewhere (they contribute nothing here).
            a1q_scale: must be None; inputs are quantized dynamically per row.
            apply_router_weight_on_input: scale each input row by its router
                weight before the experts instead of scaling the outputs.
            num_expert_group: number of expert groups for grouped top-k.
            e_score_correction_bias: float ``[global_num_experts]`` bias added to
                the scores for selection only (converted to float32).
            routed_scaling_factor: multiplies the routing weights (None -> 1.0).
            topk_group: number of groups kept by grouped top-k.

        Returns:
            ``[M, hidden_dim]`` of the dtype of ``hidden_states``.

        Raises:
            TypeError, ValueError: an argument has the wrong type, shape or
                value; the message names it.
        """
        core = _core()
        act = _as_activation(activation, "activation")
        if not self._supports_activation(act):
            raise ValueError(
                f"activation={act.name} is not supported by CPUExpertsInt4 "
                "(supported: SILU, SWIGLUOAI, SWIGLUSTEP)"
            )
        routing = self.moe_config.routing_method
        if not self._supports_routing_method(routing, self.quant_config.weight_key, None):
            raise ValueError(
                f"moe_config.routing_method={routing.name} is not supported by CPUExpertsInt4 "
                "(supported: Default, Renormalize, RenormalizeNaive)"
            )
        if topk_group is not None and num_expert_group is None:
            raise ValueError(
                f"topk_group={topk_group} is given but num_expert_group is None; "
                "grouped top-k needs both"
            )
        if a1q_scale is not None:
            raise ValueError(
                "a1q_scale must be None: CPUExpertsInt4 quantizes the inputs itself, per row, at run time"
            )
        self._check_apply_inputs(
            hidden_states, w1, w2, router_logits, global_num_experts, expert_map, e_score_correction_bias
        )

        logits = np.ascontiguousarray(router_logits, dtype=np.float32)
        bias = (
            None
            if e_score_correction_bias is None
            else np.ascontiguousarray(e_score_correction_bias, dtype=np.float32)
        )
        local_map = None if expert_map is None else np.ascontiguousarray(expert_map, dtype=np.int32)

        topk_weights, topk_ids = core.select_experts(
            logits,
            self.moe_config.experts_per_token,
            renormalize=routing in _RENORMALIZING_ROUTING,
            scoring_func="softmax",
            use_grouped_topk=num_expert_group is not None,
            num_expert_group=num_expert_group,
            topk_group=topk_group,
            e_score_correction_bias=bias,
            routed_scaling_factor=1.0 if routed_scaling_factor is None else float(routed_scaling_factor),
        )
        return core.fused_experts(
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            activation=act.moe_cpu_name,
            apply_router_weight_on_input=bool(apply_router_weight_on_input),
            w13_bias=self.quant_config.w1_bias,
            w2_bias=self.quant_config.w2_bias,
            expert_map=local_map,
        )
