"""GGUF's low-bit types (the K-quants Q2_K / Q3_K, the ternary TQ1_0 / TQ2_0, and the grid types IQ1_S, IQ1_M,
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), decoded losslessly into moe_cpu's int forms.

Every one of them is an integer value times a per-group float32 scale (minus a min for Q2_K), so each becomes
an int4 form (through a 16-value codebook where the values are not -8..7) in groups of 16, 32 or 256, or an int8
form in groups of 16 (Q2_K, Q3_K) or 32 (TQ1_0 / TQ2_0 where the int8 kernel holds their values -1..1 as 2-bit
split codes: the block's d the scale of its 8 groups; else int4 g256). ``unpack()`` equals ``gguf.quants.dequantize`` bit for bit: each scale is the float32 that
ggml computes, and value * scale is rounded once as there. IQ1_S / IQ1_M's values grid + delta (delta = +-1/8)
are held as 8 * grid + 8 * delta with the scale divided by 8 (exact: a power of two of a normal float32).

The grids of the IQ types (the 8- or 4-value rows that an index selects) are gguf-py's own tables, read from
``gguf.quants`` (the package that reads the file); the signs of IQ2_XXS / IQ2_XS / IQ3_XXS are 7 stored bits and
an eighth that makes the count of minus signs even.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from ..forms import IQ1_VALUES, IQ2_VALUES, IQ3S_VALUES, IQ3XXS_VALUES
from ._common import Part
from ._gguf_blocks import Blocks, rows

_SHIFT2 = np.array([0, 2, 4, 6], np.uint8)
_GRIDS: Dict[str, np.ndarray] = {}


def _grid(name: str) -> np.ndarray:
    """gguf-py's grid of IQ type ``name`` as int8 [entries, values per entry]."""
    if name not in _GRIDS:
        import gguf.quants as gq

        cls = getattr(gq, name, None)
        if cls is None or not hasattr(cls, "init_grid"):
            raise ImportError(f"reading GGUF {name} needs a gguf package with its grid (gguf.quants.{name}); "
                              "pip install -U gguf")
        cls.init_grid()
        g = np.asarray(cls.grid, np.float32)
        _GRIDS[name] = g.reshape(g.shape[-2], g.shape[-1]).astype(np.int8)
    return _GRIDS[name]


def _codes(values: np.ndarray, codebook: tuple) -> np.ndarray:
    """int8 values -> uint8 indices into ``codebook`` (every value is in it)."""
    lut = np.zeros(256, np.uint8)
    lut[np.asarray(codebook, np.int16) + 128] = np.arange(len(codebook), dtype=np.uint8)
    return lut[values.astype(np.int16) + 128]


def _crumbs(q: np.ndarray) -> np.ndarray:
    """K-quant 2-bit codes: bytes [..., 32 c + i] -> element 128 c + 32 j + i = bits 2j..2j+1 (uint8 [..., 4n])."""
    lead = q.shape[:-1]
    return ((q.reshape(*lead, -1, 1, 32) >> _SHIFT2[:, None]) & 3).reshape(*lead, -1)


def _bits(b: np.ndarray) -> np.ndarray:
    """Bytes [..., n] -> their 8n bits, bit j of byte i at 8 i + j (uint8)."""
    return np.unpackbits(b, axis=-1, bitorder="little")


def _even_signs(s7: np.ndarray) -> np.ndarray:
    """7 sign bits -> 8 signs (+-1 int8, [..., 8]): the eighth makes the count of minus signs even."""
    s7 = s7.astype(np.uint8)
    bits = _bits(s7[..., None])                       # [..., 8]; bit 7 is 0
    bits[..., 7] = bits[..., :7].sum(axis=-1) & 1
    return (1 - 2 * bits.astype(np.int8)).astype(np.int8)


def _signs(b: np.ndarray) -> np.ndarray:
    """Sign bytes [..., n] -> +-1 int8 [..., 8n] (bit set: minus)."""
    return (1 - 2 * _bits(b).astype(np.int8)).astype(np.int8)


def _half(x: np.ndarray) -> np.ndarray:
    """IQ2 / IQ3_XXS: float32 (0.5 + x), x an integer field."""
    return np.float32(0.5) + x.astype(np.float32)


def q2_k(t: Blocks) -> Part:
    """Q2_K (84 bytes): scales[16] (4-bit scale, 4-bit min per 16), qs[64], d, dmin: q * (d sc) - dmin m."""
    sc, d, dmin = t.b[..., 0:16], t.f16(80), t.f16(82, "dmin")
    s = d[..., None] * (sc & 15).astype(np.float32)
    m = dmin[..., None] * (sc >> 4).astype(np.float32)
    return Part("int", rows(_crumbs(t.b[..., 16:80]).astype(np.int8)), rows(s), mins=rows(m))


def q3_k(t: Blocks) -> Part:
    """Q3_K (110 bytes): hmask[32], qs[64], scales[12] (16 six-bit, - 32), d: d (sc - 32) (q - 4 (1 - hbit))."""
    N, nb = t.b.shape[:2]
    low = _crumbs(t.b[..., 32:96]).astype(np.int8)
    hbit = ((t.b[..., None, 0:32] >> np.arange(8, dtype=np.uint8)[:, None]) & 1).reshape(N, nb, 256)
    q = low - 4 * (1 - hbit.astype(np.int8))
    lo, hi = t.b[..., 96:104], t.b[..., 104:108]
    l4 = np.concatenate([lo & 15, lo >> 4], axis=-1)
    h2 = np.concatenate([(hi >> (2 * a)) & 3 for a in range(4)], axis=-1)
    sc = (l4 | (h2 << 4)).astype(np.int8) - np.int8(32)
    return Part("int", rows(q), rows(t.f16(108)[..., None] * sc.astype(np.float32)))


def _trits(b: np.ndarray, n: int) -> np.ndarray:
    """TQ1_0: the n base-3 digits of bytes b [..., m], digit k of byte j at k m + j (int8 0..2)."""
    pw = (3 ** np.arange(n)).astype(np.uint16)[:, None]
    x = (b[..., None, :].astype(np.uint16) * pw) & 255
    return ((x * 3) >> 8).astype(np.int8).reshape(*b.shape[:-1], -1)


def _tq_scales(d: np.ndarray, group: int) -> np.ndarray:
    """A block's d [N, nb] as the scale of its group of 256, or of each of its 8 groups of 32 ([N, 8 nb])."""
    return d if group == 256 else rows(np.repeat(d[..., None], 8, axis=-1))


def tq1_0(t: Blocks, group: int = 256) -> Part:
    """TQ1_0 (54 bytes): qs[48] (5 trits a byte, then 16 bytes of 5), qh[4] (4 trits), d: d (trit - 1)."""
    q = np.concatenate([_trits(t.b[..., 0:32], 5), _trits(t.b[..., 32:48], 5), _trits(t.b[..., 48:52], 4)], axis=-1)
    return Part("int", rows(q - np.int8(1)), _tq_scales(t.f16(52), group))


def tq2_0(t: Blocks, group: int = 256) -> Part:
    """TQ2_0 (66 bytes): qs[64] (2 bits a value), d: d (q - 1)."""
    return Part("int", rows(_crumbs(t.b[..., 0:64]).astype(np.int8) - np.int8(1)), _tq_scales(t.f16(64), group))


def iq2_xxs(t: Blocks) -> Part:
    """IQ2_XXS (66 bytes): d, 8 x (4 grid bytes, u32: 4 x 7 sign bits, 4-bit ls): d (0.5 + ls) / 4 per 32."""
    N, nb = t.b.shape[:2]
    idx = t.b[..., 2:66].reshape(N, nb, 8, 8)[..., :4]
    aux = t.words(2, 16, np.uint32).reshape(N, nb, 8, 2)[..., 1]
    s = t.f16(0)[..., None] * _half(aux >> 28) * np.float32(0.25)
    sg = _even_signs((aux[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & 127)   # [N, nb, 8, 4, 8]
    v = _grid("IQ2_XXS")[idx] * sg
    return Part("int", rows(_codes(v, IQ2_VALUES)), rows(s), codebook=IQ2_VALUES)


def iq2_xs(t: Blocks) -> Part:
    """IQ2_XS (74 bytes): d, u16[32] (9-bit grid index, 7 sign bits), scales[8] (4 bits per 16): d (0.5 + ls) / 4."""
    w = t.words(2, 32, np.uint16)
    sc = t.nibbles(66, 8).reshape(*t.b.shape[:2], 2, 8).transpose(0, 1, 3, 2)     # low nibble first per byte
    s = t.f16(0)[..., None] * _half(sc.reshape(*t.b.shape[:2], 16)) * np.float32(0.25)
    v = _grid("IQ2_XS")[w & 511] * _even_signs(w >> 9)
    return Part("int", rows(_codes(v, IQ2_VALUES)), rows(s), codebook=IQ2_VALUES)


def iq2_s(t: Blocks) -> Part:
    """IQ2_S (82 bytes): d, qs[32], signs[32], qh[8] (2 high index bits each), scales[8]: as IQ2_XS, grid 1024."""
    N, nb = t.b.shape[:2]
    hi = ((t.b[..., 66:74, None] >> _SHIFT2) & 3).reshape(N, nb, 32).astype(np.uint16)
    idx = t.b[..., 2:34].astype(np.uint16) | (hi << 8)
    sc = t.nibbles(74, 8).reshape(N, nb, 2, 8).transpose(0, 1, 3, 2).reshape(N, nb, 16)
    s = t.f16(0)[..., None] * _half(sc) * np.float32(0.25)
    v = _grid("IQ2_S")[idx] * _signs(t.b[..., 34:66]).reshape(N, nb, 32, 8)
    return Part("int", rows(_codes(v, IQ2_VALUES)), rows(s), codebook=IQ2_VALUES)


def iq3_xxs(t: Blocks) -> Part:
    """IQ3_XXS (98 bytes): d, qs[64] grid indices (4 values each), 8 x u32 (4 x 7 sign bits, ls): d (0.5 + ls) / 2."""
    N, nb = t.b.shape[:2]
    aux = t.words(66, 8, np.uint32)
    s = t.f16(0)[..., None] * _half(aux >> 28) * np.float32(0.5)
    sg = _even_signs((aux[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & 127).reshape(N, nb, 8, 32)
    v = _grid("IQ3_XXS")[t.b[..., 2:66]].reshape(N, nb, 8, 32) * sg
    return Part("int", rows(_codes(v, IQ3XXS_VALUES)), rows(s), codebook=IQ3XXS_VALUES)


def iq3_s(t: Blocks) -> Part:
    """IQ3_S (110 bytes): d, qs[64], qh[8] (ninth index bits), signs[32], scales[4]: d (1 + 2 ls) per 32."""
    N, nb = t.b.shape[:2]
    idx = t.b[..., 2:66].astype(np.uint16) | (_bits(t.b[..., 66:74]).astype(np.uint16) << 8)
    sc = t.nibbles(106, 4).reshape(N, nb, 2, 4).transpose(0, 1, 3, 2).reshape(N, nb, 8)
    s = t.f16(0)[..., None] * (1 + 2 * sc).astype(np.float32)
    v = _grid("IQ3_S")[idx].reshape(N, nb, 256) * _signs(t.b[..., 74:106])
    return Part("int", rows(_codes(v, IQ3S_VALUES)), rows(s), codebook=IQ3S_VALUES)


def _iq1_values(idx: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """8 * (grid + delta): grid rows of -1 / 0 / 1, delta -1/8 where ``minus`` else +1/8 (int8 [..., 8])."""
    return (8 * _grid("IQ1_S")[idx] + np.where(minus, -1, 1)[..., None]).astype(np.int8)


def iq1_s(t: Blocks) -> Part:
    """IQ1_S (50 bytes): d, qs[32], u16[8] (4 x 3 high index bits, 3-bit ls, delta sign): d (2 ls + 1) per 32."""
    N, nb = t.b.shape[:2]
    qh = t.words(34, 8, np.uint16)
    hi = (qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    idx = t.b[..., 2:34].reshape(N, nb, 8, 4).astype(np.uint16) | (hi << 8)
    dl = t.f16(0)[..., None] * (2 * ((qh >> 12) & 7) + 1).astype(np.float32)
    v = _iq1_values(idx, (qh[..., None] >> 15).astype(bool).repeat(4, axis=-1))
    return Part("int", rows(_codes(v, IQ1_VALUES)), rows(dl / np.float32(8)), codebook=IQ1_VALUES)


def iq1_m(t: Blocks) -> Part:
    """IQ1_M (56 bytes): qs[32], qh[16] (a nibble per index: 3 high bits, delta sign), u16[4] (4 x 3-bit ls, and
    d's fp16 in their top nibbles): d (2 ls + 1) per 16, delta per 8."""
    N, nb = t.b.shape[:2]
    sw = t.words(48, 4, np.uint16)
    dbits = (sw[..., 0] >> 12) | ((sw[..., 1] >> 8) & 0xF0) | ((sw[..., 2] >> 4) & 0xF00) | (sw[..., 3] & 0xF000)
    d = t.finite(np.ascontiguousarray(dbits.astype(np.uint16)).view(np.float16).astype(np.float32), "d")
    ls = ((sw[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(N, nb, 16)
    dl = d[..., None] * (2 * ls + 1).astype(np.float32)
    nib = t.nibbles(32, 16).reshape(N, nb, 2, 16).transpose(0, 1, 3, 2).reshape(N, nb, 32)
    idx = t.b[..., 0:32].astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)
    v = _iq1_values(idx, (nib & 8).astype(bool))
    return Part("int", rows(_codes(v, IQ1_VALUES)), rows(dl / np.float32(8)), codebook=IQ1_VALUES)
