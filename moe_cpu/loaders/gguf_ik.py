"""ik_llama.cpp's own GGUF types (Q6_0, the IQ*_K family, the IQ*_KS family, IQ4_KSS, IQ2_KL, the trellis IQ*_KT),
decoded losslessly into moe_cpu's int8 forms, or int4 codes through a codebook where a type's values are 16 or fewer.

Each is an integer value (a code through one of ik's non-linear tables, one of two table halves per sub-block)
times a float32 sub-block scale, which ggml computes as ``d * ls`` (d: the block's fp16 field or the row's scale,
ls: an integer) before the value multiplies it. Held as int8 codes (the table values) in groups of 16 or 32 with
that scale, ``unpack()`` rounds value * scale once, as ik's ``dequantize_row_*`` does: bit for bit. IQ2_KS, IQ3_KS
and IQ2_KL (sub-blocks of 32) take 8, 16 and 8 values in all, both table halves together: they are int4 codes
into that table as a codebook, with the same scales (half the bytes of int8, the same floats).

Layouts are ik_llama.cpp's (ggml-common.h, iqk_quantize.cpp at the commit of ik-llama-cpp-python 0.1.5), read for
facts; tests/python/test_gguf_ik.py checks every type against that wheel's own C dequantization.
The *_KS types, IQ4_KSS, IQ2_KL and the IQ*_KT start each row with its scale (fp16 or float32) before the blocks.
The trellis types' values are integers (-126 .. 126) a 13-16-bit index generates: tables of every index's values.
Left out: IQ6_K (ik's dequantization evaluates a cubic where its kernels read an integer table: no one form holds
both) and the repacked _R4 / _R8 forms (docs/formats.md).
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from ._common import Part
from ._gguf_blocks import Blocks, rows

IQ2NL = np.array([-31, -13, 1, 17, -26, -8, 6, 22], np.int8)
IQ3NL = np.array([-63, -40, -23, -10, 1, 13, 28, 47, -59, -36, -19, -6, 5, 17, 32, 51], np.int8)
IQ4K = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                 -123, -100, -79, -61, -45, -31, -18, -6, 5, 17, 29, 42, 57, 73, 93, 117], np.int8)
IQ5NL = np.array([-126, -114, -103, -92, -83, -74, -65, -57, -50, -43, -36, -30, -24, -18, -12, -6,
                  -1, 5, 11, 17, 23, 29, 36, 43, 51, 59, 68, 77, 87, 97, 109, 121,
                  -124, -112, -101, -90, -81, -72, -63, -55, -48, -41, -34, -28, -22, -16, -10, -4,
                  1, 7, 13, 19, 25, 31, 38, 45, 53, 61, 70, 79, 89, 99, 111, 123], np.int8)
# IQ2_KL: 32 pairs of values from IQ3NL's first half (low byte the first)
IQ2KL = np.array([0xe9c1, 0x0dc1, 0xc1d8, 0xf6d8, 0x0dd8, 0x2fd8, 0xd8e9, 0xe9e9, 0x01e9, 0x0de9, 0x1ce9, 0xc1f6,
                  0x01f6, 0x0df6, 0x2ff6, 0xe901, 0xf601, 0x0101, 0x0d01, 0x1c01, 0xd80d, 0xe90d, 0xf60d, 0x010d,
                  0x0d0d, 0xc11c, 0xe91c, 0x011c, 0x1c1c, 0x2f1c, 0xe92f, 0x0d2f], np.uint16).view(np.int8).reshape(32, 2)

# the int4 codebooks (16 entries, unused ones 0) of the types whose values fit one: both halves of a table together
IQ2NL_CODEBOOK = tuple(int(v) for v in IQ2NL) + (0,) * 8
IQ3NL_CODEBOOK = tuple(int(v) for v in IQ3NL)
IQ3NL_LOW_CODEBOOK = tuple(int(v) for v in IQ3NL[:8]) + (0,) * 8   # IQ2_KL's pairs

# IQ2KL's values as indices into IQ3NL_LOW_CODEBOOK (its first 8 entries are IQ3NL's first half, in order)
_IQ2KL_CODES = np.searchsorted(IQ3NL[:8], IQ2KL).astype(np.uint8)

_W = np.arange(256)   # weight index in a block of 256


def _field(b: np.ndarray, off: int, byte: np.ndarray, shift: np.ndarray, mask: int) -> np.ndarray:
    """(b[..., off + byte[w]] >> shift[w]) & mask for every w (uint8 [..., len(byte)])."""
    return (b[..., off + byte] >> shift.astype(np.uint8)) & np.uint8(mask)


def _bit(word: np.ndarray, i: np.ndarray) -> np.ndarray:
    """Bit i[j] of each word (uint16 [...]) as uint8 [..., len(i)]."""
    return ((word[..., None] >> i.astype(np.uint16)) & 1).astype(np.uint8)


def _scaled(d: np.ndarray, ls: np.ndarray) -> np.ndarray:
    """float32 d [N, nb] (or [N, 1]) times integer ls [N, nb, S] -> rows [N, nb * S]: ggml's d * ls, one rounding."""
    return rows(d[..., None] * ls.astype(np.float32))


def q6_0(t: Blocks) -> Part:
    """Q6_0 (26 bytes): d, qh[8] (2 bits each of weights i, i + 16, i + 8, i + 24), qs[16]: d (q - 32)."""
    w = _W[:32]
    j, hi = w % 16, w // 16
    q = _field(t.b, 10, j, 4 * hi, 15) | (_field(t.b, 2, j % 8, 4 * (j // 8) + 2 * hi, 3) << 4)
    return Part("int", rows(q.astype(np.int8) - np.int8(32)), t.f16(0))


def iq2_k(t: Blocks) -> Part:
    """IQ2_K (76 bytes): d, extra (a table half per 16), scales[8] (4 bits - 8), qs[64] (2 bits): d ls IQ2NL."""
    s = _W[:16]
    ls = _field(t.b, 4, s // 2, 4 * (s % 2), 15).astype(np.int8) - np.int8(8)
    e = _bit(t.words(2, 1, np.uint16)[..., 0], _W // 16)
    q = _field(t.b, 12, 32 * (_W // 128) + _W % 32, 2 * ((_W // 32) % 4), 3)
    return Part("int", rows(q + 4 * e), _scaled(t.f16(0), ls), codebook=IQ2NL_CODEBOOK)


def iq3_k(t: Blocks) -> Part:
    """IQ3_K (110 bytes): d, extra, scales_h (signs), scales_l[8] (4 bits: 2 l + 1), qs[64], qh[32]: d ls IQ3NL."""
    s, g = _W[:16], _W // 32
    mag = 2 * _field(t.b, 6, s // 2, 4 * (s % 2), 15).astype(np.int8) + np.int8(1)
    ls = np.where(_bit(t.words(4, 1, np.uint16)[..., 0], s).astype(bool), -mag, mag)
    e = _bit(t.words(2, 1, np.uint16)[..., 0], _W // 16)
    q = _field(t.b, 14, 32 * (g // 4) + _W % 32, 2 * (g % 4), 3) | (_field(t.b, 78, _W % 32, g, 1) << 2)
    return Part("int", rows(q + 8 * e), _scaled(t.f16(0), ls), codebook=IQ3NL_CODEBOOK)


def _six_bit_scales(t: Blocks, off_h: int, off_l: int) -> np.ndarray:
    """IQ4_K / IQ5_K: 16 six-bit scales (low 4 bits from scales_l, high 2 from scales_h) minus 32 (int8)."""
    s = _W[:16]
    lo = _field(t.b, off_l, s // 2, 4 * (s % 2), 15)
    return (lo | (_field(t.b, off_h, s // 4, 2 * (s % 4), 3) << 4)).astype(np.int8) - np.int8(32)


def iq4_k(t: Blocks) -> Part:
    """IQ4_K (144 bytes): d, extra, scales_h[4], scales_l[8], qs[128] (nibbles, 16 bytes a 32): d ls IQ4K."""
    e = _bit(t.words(2, 1, np.uint16)[..., 0], _W // 16)
    q = _field(t.b, 16, 16 * (_W // 32) + _W % 16, 4 * ((_W % 32) // 16), 15)
    return Part("int", rows(IQ4K[q + 16 * e]), _scaled(t.f16(0), _six_bit_scales(t, 4, 8)))


def iq5_k(t: Blocks) -> Part:
    """IQ5_K (176 bytes): as IQ4_K with 32-byte nibble runs per 64 and a fifth bit in qh[32]: d ls IQ5NL."""
    c, r = _W // 64, _W % 64
    j, nib = r % 32, r // 32
    e = _bit(t.words(2, 1, np.uint16)[..., 0], _W // 16)
    q = _field(t.b, 16, 32 * c + j, 4 * nib, 15) | (_field(t.b, 144, j, 2 * c + nib, 1) << 4)
    return Part("int", rows(IQ5NL[q + 32 * e]), _scaled(t.f16(0), _six_bit_scales(t, 4, 8)))


def iq2_ks(t: Blocks) -> Part:
    """IQ2_KS (row: fp16 D; 70 bytes: extra (halves, fifth scale bits), scales[4], qs[64]): D ls IQ2NL per 32."""
    s = _W[:8]
    extra = t.words(0, 1, np.uint16)[..., 0]
    ls = (_field(t.b, 2, s // 2, 4 * (s % 2), 15) | (_bit(extra, 8 + s) << 4)).astype(np.int8) - np.int8(16)
    q = _field(t.b, 6, 32 * (_W // 128) + _W % 32, 2 * ((_W // 32) % 4), 3)
    return Part("int", rows(q + 4 * _bit(extra, _W // 32)), _scaled(t.row_scale(np.float16), ls),
                codebook=IQ2NL_CODEBOOK)


def iq3_ks(t: Blocks) -> Part:
    """IQ3_KS (row: fp16 D; 102 bytes: extra (fifth scale bits, halves), scales[4], qs[64], qh[32]): D ls IQ3NL."""
    s, g = _W[:8], _W // 32
    extra = t.words(0, 1, np.uint16)[..., 0]
    ls = (_field(t.b, 2, s % 4, 4 * (s // 4), 15) | (_bit(extra, s) << 4)).astype(np.int8) - np.int8(16)
    q = _field(t.b, 6, 32 * (g // 4) + _W % 32, 2 * (g % 4), 3) | (_field(t.b, 70, _W % 32, g, 1) << 2)
    return Part("int", rows(q + 8 * _bit(extra, 8 + g)), _scaled(t.row_scale(np.float16), ls), codebook=IQ3NL_CODEBOOK)


def _odd_scales(sc: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """IQ4_KS / IQ5_KS / IQ4_KSS scale bytes: (byte & 254) - 127 (int16) and the table half (bit 0)."""
    return (sc & 254).astype(np.int16) - 127, (sc & 1).astype(np.uint8)


def iq4_ks(t: Blocks) -> Part:
    """IQ4_KS (row: float32 D; 136 bytes: scales[8], qs[128]): f32(D ls) IQ4K per 32."""
    ls, e = _odd_scales(t.b[..., 0:8])
    q = _field(t.b, 8, 16 * (_W // 32) + _W % 16, 4 * ((_W % 32) // 16), 15)
    return Part("int", rows(IQ4K[q + 16 * e[..., _W // 32]]), _scaled(t.row_scale(np.float32), ls))


def iq5_ks(t: Blocks) -> Part:
    """IQ5_KS (row: float32 D; 168 bytes: scales[8], qs[128], qh[32]): f32(D ls) IQ5NL per 32."""
    ls, e = _odd_scales(t.b[..., 0:8])
    c, j, nib = _W // 64, _W % 32, (_W % 64) // 32
    q = _field(t.b, 8, 32 * c + j, 4 * nib, 15) | (_field(t.b, 136, j, _W // 32, 1) << 4)
    return Part("int", rows(IQ5NL[q + 32 * e[..., _W // 32]]), _scaled(t.row_scale(np.float32), ls))


def iq4_kss(t: Blocks) -> Part:
    """IQ4_KSS (row: float32 D; 64 u16 words, 8 a 32): bit 0 of a 32's 8 words its scale byte, each word's rest
    (a ^ a >> 1 of it with bit 0 clear) its 4 nibbles: f32(D ls) IQ4K."""
    N, nb = t.b.shape[:2]
    w16 = t.words(0, 64, np.uint16).reshape(N, nb, 8, 8)
    sc = ((w16 & 1) << np.arange(8, dtype=np.uint16)).sum(axis=-1).astype(np.uint8)    # [N, nb, 8]
    a = w16 & np.uint16(0xFFFE)
    a = a ^ (a >> np.uint16(1))
    by = np.ascontiguousarray(a).view(np.uint8).reshape(N, nb, 8, 16)
    q = np.concatenate([by & 15, by >> 4], axis=-1)                                     # [N, nb, 8, 32]
    ls, e = _odd_scales(sc)
    return Part("int", rows(IQ4K[q + 16 * e[..., None]]), _scaled(t.row_scale(np.float32), ls))


def iq2_kl(t: Blocks) -> Part:
    """IQ2_KL (row: fp16 D; 86 bytes: scales_h u16, scales_l[4], qs[64], qh[16]): D ls times one of a 5-bit index's
    pair of IQ3NL values."""
    b = _W[:8]
    sh = t.words(0, 1, np.uint16)[..., 0]
    ls = (_field(t.b, 2, b % 4, 4 * (b // 4), 15) |
          (((sh[..., None] >> (2 * b).astype(np.uint16)) & 3).astype(np.uint8) << 4)).astype(np.int8) - np.int8(32)
    c, half, j = _W // 64, (_W % 64) // 32, (_W % 32) // 2
    idx = _field(t.b, 6, 16 * c + j, 4 * half, 15) | (_field(t.b, 70, j, 2 * c + half, 1) << 4)
    return Part("int", rows(_IQ2KL_CODES[idx, _W % 2]), _scaled(t.row_scale(np.float16), ls), codebook=IQ3NL_LOW_CODEBOOK)


_TRELLIS: Dict[Tuple[int, int, int], np.ndarray] = {}


def _trellis(bits: int, offset: int, n: int) -> np.ndarray:
    """ik's trellis values of every index below 2^bits: x = index + offset, then n times x *= 0xCBAC1FED (mod 2^32)
    and the sum of the four bytes of x & 0x3F3F3F3F, minus 126 (int8 [2^bits, n], -126 .. 126)."""
    key = (bits, offset, n)
    if key not in _TRELLIS:
        x = np.arange(1 << bits, dtype=np.uint32) + np.uint32(offset)
        out = np.empty((1 << bits, n), np.int8)
        for i in range(n):
            x = x * np.uint32(0xCBAC1FED)
            b = (x & np.uint32(0x3F3F3F3F)).view(np.uint8).reshape(-1, 4).astype(np.int16)
            out[:, i] = (b.sum(axis=1) - 126).astype(np.int8)
        _TRELLIS[key] = out
    return _TRELLIS[key]


def _kt_nibbles(b: np.ndarray) -> np.ndarray:
    """IQ2_KT / IQ3_KT scales[4]: the 8 blocks' nibbles, low nibbles (blocks 0..3) then high (4..7)."""
    return np.concatenate([b & 15, b >> 4], axis=-1)


def iq2_kt(t: Blocks) -> Part:
    """IQ2_KT (row: float32 D; 68 bytes: scales[4], u16[32] trellis indices of 8 values each): f32(D IQ4K[nibble])."""
    v = _trellis(16, 4096, 8)[t.words(4, 32, np.uint16)]
    return Part("int", rows(v), _scaled(t.row_scale(np.float32), IQ4K[_kt_nibbles(t.b[..., 0:4])]))


def iq3_kt(t: Blocks) -> Part:
    """IQ3_KT (row: float32 D; 100 bytes: scales[4], u16[32] indices, qh[32] signs): f32(D nibble) times |value|,
    negated where bit w / 32 of qh[w % 32] is set (ik flips the float's sign: its -0.0 is 0 here)."""
    v = np.abs(_trellis(16, 4096, 8)[t.words(4, 32, np.uint16)]).reshape(*t.b.shape[:2], 256)
    neg = _field(t.b, 68, _W % 32, _W // 32, 1).astype(bool)
    return Part("int", rows(np.where(neg, -v, v)), _scaled(t.row_scale(np.float32), _kt_nibbles(t.b[..., 0:4])))


def iq1_kt(t: Blocks) -> Part:
    """IQ1_KT (row: float32 D; 56 bytes: sh[8] (a 4-bit scale index, 4 thirteenth index bits), ql[32], qh[16]
    (index bits 8..11)): 13-bit trellis indices of 8 values, f32(D IQ4K[sh & 15]) per 32."""
    g = np.arange(32)
    blk, i = g // 4, g % 4
    sh = t.b[..., 0:8].astype(np.uint32)
    qh = t.b[..., 40 + (blk % 4) * 4 + i].astype(np.uint32)
    idx = (t.b[..., 8:40].astype(np.uint32) | ((qh << (8 - 4 * (blk // 4)).astype(np.uint32)) & 0xF00) |
           ((sh[..., blk] << (8 - i).astype(np.uint32)) & 0x1000))
    return Part("int", rows(_trellis(13, 4096, 8)[idx]), _scaled(t.row_scale(np.float32), IQ4K[t.b[..., 0:8] & 15]))


def iq4_kt(t: Blocks) -> Part:
    """IQ4_KT (row: float32 D; 128 bytes: u32[8] per 32 (bit 0 the offset, 7-bit scale, 8 x 3 index bits), ql[64],
    qh[32]): 15-bit trellis indices of 4 values, offset 4096 (+ 32768), f32(D ((s & 255) >> 1 - 64)) per 32."""
    jj = np.arange(64)
    blk, i = jj // 8, jj % 8
    shb = t.words(0, 8, np.uint32)
    idx = (t.b[..., 32:96].astype(np.uint32) |
           ((t.b[..., 96 + jj % 32].astype(np.uint32) << (8 - 4 * (jj // 32)).astype(np.uint32)) & 0xF00) |
           (((shb[..., blk] >> (8 + 3 * i).astype(np.uint32)) & 7) << 12))
    hi = (shb[..., blk] & 1).astype(bool)                                   # [N, nb, 64]
    v = np.where(hi[..., None], _trellis(15, 4096 + 32768, 4)[idx], _trellis(15, 4096, 4)[idx])
    ls = ((shb & 255) >> 1).astype(np.int16) - 64
    return Part("int", rows(v), _scaled(t.row_scale(np.float32), ls))


# name -> (ik type id, native scheme, group, elements per block, bytes per block, row scale bytes, decoder, int4 codebook)
IK_QUANT: Dict[str, tuple] = {
    "Q6_0": (133, "int8_w8a8", 32, 32, 26, 0, q6_0, None),
    "IQ2_K": (137, "int4_w4a8", 16, 256, 76, 0, iq2_k, IQ2NL_CODEBOOK),
    "IQ3_K": (138, "int4_w4a8", 16, 256, 110, 0, iq3_k, IQ3NL_CODEBOOK),
    "IQ4_K": (139, "int8_w8a8", 16, 256, 144, 0, iq4_k, None),
    "IQ5_K": (140, "int8_w8a8", 16, 256, 176, 0, iq5_k, None),
    "IQ4_KS": (144, "int8_w8a8", 32, 256, 136, 4, iq4_ks, None),
    "IQ2_KS": (145, "int4_w4a8", 32, 256, 70, 2, iq2_ks, IQ2NL_CODEBOOK),
    "IQ4_KSS": (146, "int8_w8a8", 32, 256, 128, 4, iq4_kss, None),
    "IQ5_KS": (152, "int8_w8a8", 32, 256, 168, 4, iq5_ks, None),
    "IQ3_KS": (156, "int4_w4a8", 32, 256, 102, 2, iq3_ks, IQ3NL_CODEBOOK),
    "IQ2_KL": (157, "int4_w4a8", 32, 256, 86, 2, iq2_kl, IQ3NL_LOW_CODEBOOK),
    "IQ2_KT": (153, "int8_w8a8", 32, 256, 68, 4, iq2_kt, None),
    "IQ3_KT": (154, "int8_w8a8", 32, 256, 100, 4, iq3_kt, None),
    "IQ4_KT": (155, "int8_w8a8", 32, 256, 128, 4, iq4_kt, None),
    "IQ1_KT": (158, "int8_w8a8", 32, 256, 56, 4, iq1_kt, None),
}
