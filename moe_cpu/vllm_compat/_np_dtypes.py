"""NumPy dtype helpers (vLLM has no counterpart: it uses ``torch.dtype``)."""

from __future__ import annotations

from typing import Any

import numpy as np

DTypeLike = Any  # a NumPy dtype, a scalar type, ml_dtypes.bfloat16 or a dtype name


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
