"""dtype helpers: bfloat16 / float8 arrays from ml_dtypes travel to the core as raw bits (views, no copies)."""
from __future__ import annotations

import numpy as np

try:  # ml_dtypes is optional
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    _ml = None


def is_named(a: object, name: str) -> bool:
    """True when `a` is an ndarray whose dtype is the ml_dtypes type `name`."""
    # dtype.type.__name__: the same answer as dtype.name for these types, without its string building
    return isinstance(a, np.ndarray) and a.dtype.type.__name__ == name


def as_bits(a: object, name: str, bits: type) -> object:
    """View an ml_dtypes array (dtype `name`) as unsigned bits; anything else is returned unchanged."""
    if is_named(a, name):
        return a.view(bits)
    return a


def bf16_dtype() -> np.dtype | None:
    """ml_dtypes.bfloat16 as a NumPy dtype, or None without ml_dtypes."""
    return None if _ml is None else np.dtype(_ml.bfloat16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits (or any 2-byte view of them) -> float32 values (exact)."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bfloat16 bits, rounded to nearest even (NaN stays a quiet NaN)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    bits = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)   # no carry out: only NaN bits reach it
    nan = np.isnan(x)
    if nan.any():
        bits[nan] = (u[nan] >> 16).astype(np.uint16) | 0x0040
    return bits
