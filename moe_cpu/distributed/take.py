"""A PackedExperts holding a subset of another's experts (re-packed from its codes, bit for bit)."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .. import api
from .._core import PackedExperts


def take_experts(w: PackedExperts, ids: Sequence[int]) -> Optional[PackedExperts]:
    """Experts ``ids`` of ``w`` (in that order), packed anew from ``w.unpack_quantized()``; None for no ids.

    The codes, scales, zero points, codebook, mins, activations (A8 / A16) and A8 activation block are kept, so
    each expert computes exactly what it computed in ``w``. This unpacks all of ``w`` once: to hold only a rank's share in
    memory, load with ``EPMoELayer.from_pretrained`` / ``from_float`` instead.
    """
    ids = list(ids)
    if not ids:
        return None
    d = w.unpack_quantized()
    per_expert = ("qweight", "scales", "zeros", "mins", "g_idx", "weight", "scale_inv")
    sub = {k: (np.ascontiguousarray(v[ids]) if k in per_expert and v is not None else v) for k, v in d.items()}
    if w.scheme in ("int4_w4a8", "int4_w4a16"):   # the same activations too: A8 / A16, the A8 block
        return api.pack_int4(sub["qweight"], sub["scales"], w.group_size, sub.get("zeros"),
                             codebook=sub.get("codebook"), mins=sub.get("mins"), g_idx=sub.get("g_idx"),
                             scheme=w.scheme, act_block=w.act_block)
    if w.scheme in ("int8_w8a8", "int8_w8a16"):
        return api.pack_int8(sub["qweight"], sub["scales"], w.group_size, mins=sub.get("mins"), g_idx=sub.get("g_idx"),
                             scheme=w.scheme, act_block=w.act_block)
    if w.scheme == "fp8_w8a16":
        return api.pack_fp8(sub["weight"], sub["scale_inv"], tuple(w.block_size))
    return api.pack_bf16(sub["weight"])
