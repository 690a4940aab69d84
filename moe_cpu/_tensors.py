"""torch CPU tensors <-> NumPy views, zero copy (used by torch_ops and integrations; imports torch).

bf16 has no NumPy dtype: its bits travel as uint16 (``t.view(torch.int16).numpy().view(np.uint16)``).
Nothing is converted: a wrong device, dtype or stride raises, naming the argument.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64"}


def to_numpy(t: object, name: str, dtypes: Sequence[torch.dtype]) -> np.ndarray:
    """A NumPy view of CPU tensor ``t`` (bf16 -> uint16 bits); TypeError / ValueError naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; moe_cpu runs on the CPU (move it with .cpu())")
    if t.dtype not in dtypes:
        want = " or ".join(_NAMES.get(d, str(d)) for d in dtypes)
        raise TypeError(f"{name} has dtype {t.dtype} but {want} was expected (no silent conversion)")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous()); strides {tuple(t.stride())}")
    t = t.detach()      # a view: .numpy() refuses tensors that require grad
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def opt_numpy(t: Optional[torch.Tensor], name: str, dtypes: Sequence[torch.dtype]) -> Optional[np.ndarray]:
    return None if t is None else to_numpy(t, name, dtypes)


def to_torch(a: np.ndarray, bf16: bool) -> torch.Tensor:
    """The tensor sharing ``a``'s memory: float32 / int32 as they are, uint16 bits as bfloat16 when ``bf16``."""
    if bf16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
