"""The int4 codebooks of the checkpoint weight forms, in one place (loaders, bench and CLI read them here).

A codebook gives the integer value of each 4-bit code u = 0..15 (``pack_int4(..., codebook=)``); the
weight is ``codebook[u] * scale`` (minus the group min, for forms with mins).
"""
from __future__ import annotations

import numpy as np

__all__ = ["IQ1_VALUES", "IQ2_VALUES", "IQ3S_VALUES", "IQ3XXS_VALUES", "IQ4_NL_VALUES", "MXFP4_VALUES", "UNSIGNED4",
           "mxfp4_scales"]

# llama.cpp's IQ4_NL / IQ4_XS non-linear table (kvalues_iq4nl).
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# MXFP4's e2m1 values times 2 (integers), so a block's weight is MXFP4_VALUES[q] * 2^(e8m0 - 128).
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
# Unsigned codes (Q4_1, Q4_K: value u, the offset carried by the group min).
UNSIGNED4 = tuple(range(16))
# The grid values of GGUF's IQ types with their signs (loaders/gguf_lowbit.py), padded with zeros to 16 codes:
# IQ2_XXS (+-8, +-25, +-43); IQ3_XXS (+-4 ... +-52 by 8, +-62); IQ3_S (the odd +-1 .. +-15); IQ1_S 8 * (grid + delta)
# for grid -1, 0, 1 and delta +-1/8 (the scale divided by 8).
IQ2_VALUES = (-43, -25, -8, 8, 25, 43) + (0,) * 10
IQ3XXS_VALUES = tuple(sorted(s * v for s in (-1, 1) for v in (4, 12, 20, 28, 36, 44, 52, 62)))
IQ3S_VALUES = tuple(sorted(s * v for s in (-1, 1) for v in range(1, 16, 2)))
IQ1_VALUES = (-9, -7, -1, 1, 7, 9) + (0,) * 10


def mxfp4_scales(e8m0: np.ndarray) -> np.ndarray:
    """float32 2^(e - 128) per e8m0 byte: the group scale that goes with MXFP4_VALUES (exact)."""
    return np.ldexp(np.float32(1), e8m0.astype(np.int32) - 128).astype(np.float32)
