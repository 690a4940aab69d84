"""Quantization keys; vLLM: ``vllm/model_executor/layers/quantization/utils/quant_utils.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from ._np_dtypes import DTypeLike, _canonical_dtype, _dtype_abbreviation


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
