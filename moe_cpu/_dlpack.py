"""DLPack at the API: torch, JAX and other CPU producers in, zero copy; results back in the caller's library.

A public function decorated with ``accepts_dlpack(names...)`` takes, for each named argument, a NumPy
array or any object with ``__dlpack__`` / ``__dlpack_device__`` on the CPU. Such an object is imported by
the C++ binding (``_core.from_dlpack``: versioned or legacy capsule, a NumPy view that owns the producer's
tensor; bfloat16 and float8_e4m3fn arrive as their uint bits, which the API takes as those types). When
any argument came that way, array results go back through the first such argument's library: torch
tensors (``torch.from_numpy``, sharing memory; bf16 results as ``torch.bfloat16``) or JAX arrays (JAX's
``from_dlpack``, which may copy into its own buffer). An ``out`` / in-place argument is returned as the
caller's own object. torch and JAX are imported only here and only when the caller passed their arrays.
"""
from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional, Tuple

import numpy as np

from . import _core

_PLAIN = (np.ndarray, type(None), bool, int, float, str, list, tuple)


class _ForeignTypes(dict):
    """type -> whether its objects are foreign arrays, filled on first sight (every argument of every call)."""
    def __missing__(self, t: type) -> bool:
        if len(self) >= 256:   # classes made on the fly: keep the cache small
            self.clear()
        r = self[t] = not issubclass(t, _PLAIN) and hasattr(t, "__dlpack__")
        return r


_FOREIGN_TYPE = _ForeignTypes()
_foreign_type = _FOREIGN_TYPE.__getitem__


def is_foreign(v: object) -> bool:
    """An array from another library (has ``__dlpack__``; NumPy arrays are not foreign)."""
    return _foreign_type(type(v))


def library_of(v: object) -> str:
    return type(v).__module__.split(".")[0]


def import_array(v: object, name: str) -> Tuple[np.ndarray, str]:
    """(NumPy view of v, kind): kind "bfloat16" / "float8_e4m3fn" when the view holds those as bits.
    A producer that refuses to export (a tensor that requires grad, a sparse or meta tensor) is named."""
    try:
        return tuple(_core.from_dlpack(v, name))
    except (BufferError, RuntimeError) as e:
        raise TypeError(f"{name}: this {library_of(v)} array cannot be read through DLPack ({e})") from None
    except ValueError as e:
        if str(e).startswith(name):
            raise
        raise ValueError(f"{name}: this {library_of(v)} array cannot be read through DLPack ({e})") from None


def _dtype_error(e: TypeError, given: dict) -> TypeError:
    """A dtype error about an argument that arrived as bfloat16 / float8 bits names that type, not the bits'."""
    text = str(e)
    for n, (_, arr, kind) in given.items():
        if kind and text.startswith(f"{n} must have dtype") and f"got {arr.dtype}" in text:
            return TypeError(text.replace(f"got {arr.dtype}", f"got {kind}"))
    return e


def to_caller(a: object, lib: Optional[str], bf16: bool) -> object:
    """A NumPy result as the caller's library's array (anything else unchanged)."""
    if not isinstance(a, np.ndarray) or lib is None:
        return a
    if lib == "torch" and "torch" in sys.modules:
        from ._tensors import to_torch   # imports torch, which the caller's tensor already loaded
        return to_torch(a, bf16 and a.dtype == np.uint16)
    if lib in ("jax", "jaxlib") and "jax" in sys.modules:
        import jax
        import jax.numpy as jnp
        out = jnp.from_dlpack(a)
        if bf16 and a.dtype == np.uint16:
            out = jax.lax.bitcast_convert_type(out, jnp.bfloat16)
        return out
    return a


def accepts_dlpack(*names: str, bf16_from: Optional[str] = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Let the arguments ``names`` of a public function be DLPack producers (see the module doc).
    ``bf16_from``: the argument whose bfloat16-ness the array results keep (hidden states)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not any(map(_foreign_type, map(type, args))) and not (
                    kwargs and any(map(_foreign_type, map(type, kwargs.values())))):
                return fn(*args, **kwargs)   # NumPy callers: no binding, no conversion
            bound = sig.bind(*args, **kwargs)
            lib, bf16, given = None, False, {}
            for n in names:
                v = bound.arguments.get(n)
                if is_foreign(v):
                    arr, kind = import_array(v, n)
                    given[n] = (v, arr, kind)
                    bound.arguments[n] = arr
                    lib = lib or library_of(v)
                    bf16 = bf16 or (n == bf16_from and kind == "bfloat16")
            stray = [k for k, v in bound.arguments.items() if k not in given and is_foreign(v)]
            if stray:
                raise TypeError(f"{fn.__name__}: argument {stray[0]} cannot be a {type(bound.arguments[stray[0]]).__name__}")
            try:
                res = fn(*bound.args, **bound.kwargs)
            except TypeError as e:
                err = _dtype_error(e, given)
                if err is e:
                    raise
                raise err from None
            def back(r: Any) -> Any:
                for v, arr, _ in given.values():   # out= / inplace: the caller's own object, written through
                    if r is arr:
                        return v
                return to_caller(r, lib, bf16)
            if hasattr(res, "_dlpack_caller"):   # a pending result (Stream.submit): converted when it is read
                res._dlpack_caller = back
                return res
            for v, arr, _ in given.values():   # out= / inplace: the caller's own object, written through
                if res is arr:
                    return v
            if isinstance(res, tuple):
                return tuple(to_caller(r, lib, bf16) for r in res)
            return to_caller(res, lib, bf16)
        wrapper.__signature__ = sig   # type: ignore[attr-defined]
        return wrapper
    return deco

