"""ik_llama.cpp's row-interleaved types (``_R4`` / ``_R8``) back to their base type's blocks.

ik's ``llama-quantize`` can save a tensor with R consecutive rows interleaved block by block: for each block index,
one repacked block holds the R rows' blocks, their scales gathered at the front and their codes interleaved in 4- or
8-byte runs (some types also regroup nibbles, 2-bit codes, high bits and 6-bit scales, or recode sign indices).
Every such layout is a fixed permutation of the R base blocks' bits, so the loader rebuilds the base blocks exactly
and reads them as it reads the base type. Layouts: ik's ``ggml-common.h`` and ``iqk_quantize.cpp`` (``repack_*``)
at the commit of ``ik-llama-cpp-python`` 0.1.5.

Each rebuild takes uint8 ``[G, nb, R * size]`` (G groups of R rows, nb blocks a row) and returns the base blocks
``[G * R, nb, size]`` (rows in order); ``base_rows`` adds the row scales of the types that start rows with one.
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np


def _rows(blocks: np.ndarray) -> np.ndarray:
    """[G, nb, R, size] -> [G * R, nb, size]."""
    G, nb, R, size = blocks.shape
    return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3)).reshape(G * R, nb, size)


def _fp16s(b: np.ndarray, R: int, at: int = 0) -> np.ndarray:
    """R fp16 fields from byte ``at`` of each repacked block: [G, nb, R, 2]."""
    return b[..., at:at + 2 * R].reshape(*b.shape[:2], R, 2)


def q4_0_r8(b: np.ndarray) -> np.ndarray:
    """d[8], then qs[128]: byte 32 l + 4 k + i is row k's qs[4 l + i]."""
    qs = b[..., 16:].reshape(*b.shape[:2], 4, 8, 4).transpose(0, 1, 3, 2, 4).reshape(*b.shape[:2], 8, 16)
    return _rows(np.concatenate([_fp16s(b, 8), qs], axis=-1))


def q8_0_r8(b: np.ndarray) -> np.ndarray:
    """d[8], then qs[256]: byte 128 h + 32 l + 4 k + i is row k's qs[16 h + 4 l + i]."""
    qs = b[..., 16:].reshape(*b.shape[:2], 2, 4, 8, 4).transpose(0, 1, 4, 2, 3, 5).reshape(*b.shape[:2], 8, 32)
    return _rows(np.concatenate([_fp16s(b, 8), qs], axis=-1))


def _fields(packed: np.ndarray, bits: int) -> np.ndarray:
    """Fields of ``bits`` bits (1, 2 or 4): field i at byte i % n, bits ``bits * (i // n)`` up, for the n bytes of
    ``packed``: [G, nb, 8 n / bits] in field order."""
    n = packed.shape[-1]
    i = np.arange(n * 8 // bits)
    return ((packed[..., i % n] >> (bits * (i // n))) & ((1 << bits) - 1)).astype(np.uint8)


def _per_row(f: np.ndarray, R: int, halves: int = 1) -> np.ndarray:
    """Fields of sub-block ib (and half h) of row k at i = 2 R ib + R h + k (or R ib + k) -> [G, nb, R (k),
    blocks * halves] in the base's order (ib, h)."""
    return f.reshape(*f.shape[:2], -1, halves, R).transpose(0, 1, 4, 2, 3).reshape(*f.shape[:2], R, -1)


def iq4_xs_r8(b: np.ndarray) -> np.ndarray:
    """d[8], scales_h[16], scales_l[32], qs[1024]. Sub-block ib of row k: low scale bits as field 8 ib + k of
    scales_l (4 bits) and high as field 8 ib + k of scales_h (2 bits); its codes in bytes 128 ib + 32 p + 4 k + i,
    p = 0 / 1: the low nibbles of qs[16 ib + 8 p + i] (low) and qs[16 ib + 8 p + 4 + i] (high), p = 2 / 3 the high
    nibbles of the same bytes."""
    G, nb = b.shape[:2]
    d = _fp16s(b, 8)
    sl, sh = _per_row(_fields(b[..., 32:64], 4), 8), _per_row(_fields(b[..., 16:32], 2), 8)   # [G, nb, 8 (k), 8]
    scales_h = np.zeros((G, nb, 8), np.uint16)
    for ib in range(8):
        scales_h |= sh[..., ib].astype(np.uint16) << (2 * ib)
    scales_l = sl[..., 0::2] | (sl[..., 1::2] << 4)                # [G, nb, 8, 4]
    q = b[..., 64:].reshape(G, nb, 8, 4, 8, 4)                       # [ib, p, k, i]
    half = lambda p: np.stack([q[:, :, :, p] & 0xF, q[:, :, :, p] >> 4], axis=3)   # [ib, j (+4), k, i]
    lo = np.concatenate([half(0), half(1)], axis=3)                 # [G, nb, ib, 4 (j), k, i]: byte 16 ib + 4 j + i
    hi = np.concatenate([half(2), half(3)], axis=3)
    qs = (lo | (hi << 4)).transpose(0, 1, 4, 2, 3, 5).reshape(G, nb, 8, 128)
    return _rows(np.concatenate([d, scales_h[..., None].view(np.uint8), scales_l, qs], axis=-1))


# The _R4 types of 4-bit runs (IQ4_NL, Q5_0, Q6_0 and the K-quants): each 32-weight sub-block of the 4 rows takes
# 64 bytes, byte 16 p + 4 k + i holding row k's low 4 bits of weights _RUN[p] + i (low nibble) and _RUN[p] + 8 + i
# (high nibble); high bits sit in 16-byte groups (4 k + i) whose fields hold the weights at these offsets + i.
_RUN = (0, 16, 4, 20)
_HIGH_Q5_0 = ((0, 16, 4, 20, 8, 24, 12, 28),)        # 1 bit each
_HIGH_Q5_K = ((0, 8, 4, 12, 16, 24, 20, 28),)
_HIGH_Q6 = {"Q6_0": ((0, 4, 8, 12), (16, 20, 24, 28)), "Q6_K": ((0, 8, 4, 12), (16, 24, 20, 28))}   # 2 bits each


def _low_codes(q: np.ndarray) -> np.ndarray:
    """Low 4 bits of S sub-blocks of 4 rows, q [G, nb, S * 64] -> [G, nb, 4 (k), S, 32]."""
    G, nb = q.shape[:2]
    q = q.reshape(G, nb, -1, 4, 4, 4).transpose(0, 1, 4, 2, 3, 5)      # [k, S, p, i]
    L = np.empty((G, nb, 4, q.shape[3], 32), np.uint8)
    for p, at in enumerate(_RUN):
        L[..., at:at + 4] = q[..., p, :] & 0xF
        L[..., at + 8:at + 12] = q[..., p, :] >> 4
    return L


def _high_codes(qh: np.ndarray, fields: tuple, bits: int) -> np.ndarray:
    """High bits of S sub-blocks of 4 rows, qh [G, nb, S * len(fields) * 16] -> [G, nb, 4 (k), S, 32]."""
    G, nb = qh.shape[:2]
    qh = qh.reshape(G, nb, -1, len(fields), 4, 4).transpose(0, 1, 4, 2, 3, 5)   # [k, S, group, i]
    H = np.empty((G, nb, 4, qh.shape[3], 32), np.uint8)
    for g, offsets in enumerate(fields):
        for f, at in enumerate(offsets):
            H[..., at:at + 4] = (qh[..., g, :] >> (bits * f)) & ((1 << bits) - 1)
    return H


def _k_scales(packed_h: np.ndarray, packed_l: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K _R4 scales and mins (sub-block ib of row k: field 4 ib + k; 6-bit scale = scales_l's low nibble +
    scales_h bits 0-1 << 4, min = the high nibble + bits 2-3) -> ggml's 12-byte packing per row [G, nb, 4, 12]."""
    i = np.arange(8)[None, :] * 4 + np.arange(4)[:, None]               # [k, ib]
    sl = packed_l[..., i]
    sh = (packed_h[..., i % 16] >> (4 * (i // 16))) & 0xF
    sc, mn = (sl & 0xF) | ((sh & 3) << 4), (sl >> 4) | ((sh >> 2) << 4)
    s = np.empty((*sc.shape[:3], 12), np.uint8)                        # get_scale_min_k4's order
    s[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    s[..., 4:8] = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    s[..., 8:12] = (sc[..., 4:] & 0xF) | ((mn[..., 4:] & 0xF) << 4)
    return s


def _k_qs(L: np.ndarray) -> np.ndarray:
    """4-bit codes [G, nb, 4, 256] -> ggml's K-quant qs: byte 32 c + j = weight 64 c + j | weight 64 c + 32 + j << 4."""
    L = L.reshape(*L.shape[:3], 4, 2, 32) & 0xF
    return (L[..., 0, :] | (L[..., 1, :] << 4)).reshape(*L.shape[:3], 128)


def iq4_nl_r4(b: np.ndarray) -> np.ndarray:
    """d[4], qs[64] (4-bit indices as _RUN lays them)."""
    L = _low_codes(b[..., 8:])[..., 0, :]                               # [G, nb, 4, 32]
    return _rows(np.concatenate([_fp16s(b, 4), L[..., :16] | (L[..., 16:] << 4)], axis=-1))


def q5_0_r4(b: np.ndarray) -> np.ndarray:
    """d[4], qh[16] (fifth bits), qs[64]."""
    L = (_low_codes(b[..., 24:]) | (_high_codes(b[..., 8:24], _HIGH_Q5_0, 1) << 4))[..., 0, :]
    qh = np.zeros(L.shape[:3], np.uint32)
    for j in range(32):
        qh |= (L[..., j].astype(np.uint32) >> 4) << j
    qs = (L[..., :16] & 0xF) | ((L[..., 16:] & 0xF) << 4)
    return _rows(np.concatenate([_fp16s(b, 4), qh[..., None].view(np.uint8), qs], axis=-1))


def q6_0_r4(b: np.ndarray) -> np.ndarray:
    """d[4], qh[32] (bits 5-6), qs[64]."""
    L = (_low_codes(b[..., 40:]) | (_high_codes(b[..., 8:40], _HIGH_Q6["Q6_0"], 2) << 4))[..., 0, :]
    h = L >> 4
    qh = h[..., 0:8] | (h[..., 16:24] << 2) | (h[..., 8:16] << 4) | (h[..., 24:32] << 6)
    qs = (L[..., :16] & 0xF) | ((L[..., 16:] & 0xF) << 4)
    return _rows(np.concatenate([_fp16s(b, 4), qh, qs], axis=-1))


def q4_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4] then dmin[4], scales_h[16], scales_l[32], qs[512]."""
    L = _low_codes(b[..., 64:]).reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([_fp16s(b, 4), _fp16s(b, 4, 8), _k_scales(b[..., 16:32], b[..., 32:64]), _k_qs(L)],
                                axis=-1))


def q5_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4] then dmin[4], scales_h[16], scales_l[32], qh[128] (fifth bits), qs[512]."""
    L = (_low_codes(b[..., 192:]) | (_high_codes(b[..., 64:192], _HIGH_Q5_K, 1) << 4)).reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([_fp16s(b, 4), _fp16s(b, 4, 8), _k_scales(b[..., 16:32], b[..., 32:64]),
                                 _bit_planes(L, 4), _k_qs(L)], axis=-1))


def q6_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4], scales[64] (row k's scale 2 ib + h at 8 ib + 4 h + k), qh[256] (bits 5-6), ql[512]."""
    G, nb = b.shape[:2]
    sc = b[..., 8:72].reshape(G, nb, 8, 2, 4).transpose(0, 1, 4, 2, 3).reshape(G, nb, 4, 16)
    L = (_low_codes(b[..., 328:]) | (_high_codes(b[..., 72:328], _HIGH_Q6["Q6_K"], 2) << 4)).reshape(G, nb, 4, 2, 4, 32)
    ql = np.concatenate([(L[..., 0, :] & 0xF) | ((L[..., 2, :] & 0xF) << 4),
                         (L[..., 1, :] & 0xF) | ((L[..., 3, :] & 0xF) << 4)], axis=-1).reshape(G, nb, 4, 128)
    qh = (L[..., 0, :] >> 4) | ((L[..., 1, :] >> 4) << 2) | ((L[..., 2, :] >> 4) << 4) | ((L[..., 3, :] >> 4) << 6)
    return _rows(np.concatenate([ql, qh.reshape(G, nb, 4, 64), sc, _fp16s(b, 4)], axis=-1))


# ik's IQ2_K ... IQ5_K and IQ4_KS / IQ5_KS _R4 forms. Per sub-block ib of row k: the extra bits of its two halves
# at bit ib of extra[k] and extra[k + 4]; its scale fields at 8 ib + 4 h + k (_per_row). 2-bit codes: byte
# 32 ib + 16 h + 4 k + i holds weights 32 ib + 16 h + 4 f + i at bits 2 f; high bits as _high_codes lays them.
_HIGH_IQ3_K = ((0, 4, 8, 12, 16, 20, 24, 28),)
_HIGH_IQ5_K = ((0, 8, 16, 24, 4, 12, 20, 28),)


def _extra(b: np.ndarray) -> np.ndarray:
    """extra[8] of 4 rows -> each row's u16 (bit 2 ib + h: half h of sub-block ib) as bytes [G, nb, 4, 2]."""
    e = np.zeros((*b.shape[:2], 4), np.uint16)
    for ib in range(8):
        for h in range(2):
            e |= ((b[..., 4 * h:4 * h + 4] >> ib) & 1).astype(np.uint16) << (2 * ib + h)
    return e[..., None].view(np.uint8)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """2-bit codes of 4 rows, q [G, nb, 256] -> [G, nb, 4, 256] (weights in order)."""
    G, nb = q.shape[:2]
    q = q.reshape(G, nb, 8, 2, 4, 4).transpose(0, 1, 4, 2, 3, 5)       # [k, ib, h, i]
    L = np.empty((G, nb, 4, 8, 2, 4, 4), np.uint8)                     # [k, ib, h, f, i]
    for f in range(4):
        L[..., f, :] = (q >> (2 * f)) & 3
    return L.reshape(G, nb, 4, 256)


def _crumb_qs(L: np.ndarray) -> np.ndarray:
    """Low 2 bits of codes [G, nb, 4, 256] -> ggml's 64 bytes: byte 32 c + j bits 2 s = weight 128 c + 32 s + j."""
    L = L.reshape(*L.shape[:3], 2, 4, 32) & 3
    return (L[..., 0, :] | (L[..., 1, :] << 2) | (L[..., 2, :] << 4) | (L[..., 3, :] << 6)).reshape(*L.shape[:3], 64)


def _nibble_runs(L: np.ndarray) -> np.ndarray:
    """4-bit codes [G, nb, 4, 256] -> per 32 weights IQ4_NL's 16 bytes (low nibble j, high j + 16)."""
    L = L.reshape(*L.shape[:3], 8, 2, 16) & 0xF
    return (L[..., 0, :] | (L[..., 1, :] << 4)).reshape(*L.shape[:3], 128)


def _bit_planes(L: np.ndarray, shift: int) -> np.ndarray:
    """Bit ``shift`` of codes [G, nb, 4, 256] -> 32 bytes, byte j bit b = weight 32 b + j's (Q5_K, IQ3_K, IQ5_K)."""
    h = ((L >> shift) & 1).reshape(*L.shape[:3], 8, 32)
    out = np.zeros((*L.shape[:3], 32), np.uint8)
    for bit in range(8):
        out |= h[..., bit, :] << bit
    return out


def iq2_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4], extra[8], scales[32] (4-bit fields), qs[256] (2-bit codes)."""
    sc = _per_row(_fields(b[..., 16:48], 4), 4, 2)                      # [G, nb, 4, 16] (ib, h)
    L = _crumbs(b[..., 48:])
    return _rows(np.concatenate([_fp16s(b, 4), _extra(b[..., 8:16]), sc[..., 0::2] | (sc[..., 1::2] << 4),
                                 _crumb_qs(L)], axis=-1))


def iq3_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4], extra[8], scales_h[8] (sign bits: as extra), scales_l[32] (4-bit fields), qs[256], qh[128] (third bits)."""
    sc = _per_row(_fields(b[..., 24:56], 4), 4, 2)
    L = _crumbs(b[..., 56:312]).reshape(*b.shape[:2], 4, 8, 32) | (_high_codes(b[..., 312:], _HIGH_IQ3_K, 1) << 2)
    L = L.reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([_fp16s(b, 4), _extra(b[..., 8:16]), _extra(b[..., 16:24]),
                                 sc[..., 0::2] | (sc[..., 1::2] << 4), _crumb_qs(L), _bit_planes(L, 2)], axis=-1))


def _iq45_k_scales(b: np.ndarray) -> np.ndarray:
    """IQ4_K / IQ5_K _R4 scales_h[16] (2-bit fields), scales_l[32] (4-bit) -> the base's scales_h[4], scales_l[8]."""
    sh, sl = _per_row(_fields(b[..., 16:32], 2), 4, 2), _per_row(_fields(b[..., 32:64], 4), 4, 2)
    h = sh[..., 0::2] | (sh[..., 1::2] << 2)                             # per ib: 4 bits
    return np.concatenate([h[..., 0::2] | (h[..., 1::2] << 4), sl[..., 0::2] | (sl[..., 1::2] << 4)], axis=-1)


def iq4_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4], extra[8], scales_h[16], scales_l[32], qs[512] (4-bit runs)."""
    L = _low_codes(b[..., 64:]).reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([_fp16s(b, 4), _extra(b[..., 8:16]), _iq45_k_scales(b), _nibble_runs(L)], axis=-1))


def iq5_k_r4(b: np.ndarray) -> np.ndarray:
    """As IQ4_K_R4, then qh[128] (fifth bits); the base keeps K-quant nibbles (_k_qs) and bit planes."""
    L = (_low_codes(b[..., 64:576]) | (_high_codes(b[..., 576:], _HIGH_IQ5_K, 1) << 4)).reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([_fp16s(b, 4), _extra(b[..., 8:16]), _iq45_k_scales(b), _k_qs(L), _bit_planes(L, 4)],
                                axis=-1))


def iq4_ks_r4(b: np.ndarray) -> np.ndarray:
    """scales[32] (row k's sub-block ib at 4 ib + k), qs[512] (4-bit runs); the row scales: base_rows."""
    sc = b[..., :32].reshape(*b.shape[:2], 8, 4).transpose(0, 1, 3, 2)
    L = _low_codes(b[..., 32:]).reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([sc, _nibble_runs(L)], axis=-1))


def iq5_ks_r4(b: np.ndarray) -> np.ndarray:
    """As IQ4_KS_R4, then qh[128] (fifth bits); the base keeps K-quant nibbles and bit planes."""
    sc = b[..., :32].reshape(*b.shape[:2], 8, 4).transpose(0, 1, 3, 2)
    L = (_low_codes(b[..., 32:544]) | (_high_codes(b[..., 544:], _HIGH_IQ5_K, 1) << 4)).reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([sc, _k_qs(L), _bit_planes(L, 4)], axis=-1))


def q2_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4] then dmin[4], scales[64] (row k's scale byte ib at 4 ib + k), qs[256] (2-bit codes as IQ2_K_R4's)."""
    sc = b[..., 16:80].reshape(*b.shape[:2], 16, 4).transpose(0, 1, 3, 2)
    return _rows(np.concatenate([sc, _crumb_qs(_crumbs(b[..., 80:])), _fp16s(b, 4), _fp16s(b, 4, 8)], axis=-1))


def q3_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4], scales_h[16] (2-bit fields), scales_l[32] (4-bit), qh[128] (third bits as IQ3_K_R4's), qs[256]."""
    Ld = _per_row(_fields(b[..., 24:56], 4), 4, 2) | (_per_row(_fields(b[..., 8:24], 2), 4, 2) << 4)   # 6-bit, [.., 16]
    s = np.empty((*Ld.shape[:3], 12), np.uint8)                            # ggml's Q3_K packing of 16 6-bit scales
    s[..., 0:4] = (Ld[..., 0:4] & 0xF) | ((Ld[..., 8:12] & 0xF) << 4)
    s[..., 4:8] = (Ld[..., 4:8] & 0xF) | ((Ld[..., 12:16] & 0xF) << 4)
    s[..., 8:12] = ((Ld[..., 0:4] >> 4) | ((Ld[..., 4:8] >> 4) << 2) | ((Ld[..., 8:12] >> 4) << 4)
                    | ((Ld[..., 12:16] >> 4) << 6))
    L = _crumbs(b[..., 184:]).reshape(*b.shape[:2], 4, 8, 32) | (_high_codes(b[..., 56:184], _HIGH_IQ3_K, 1) << 2)
    L = L.reshape(*b.shape[:2], 4, 256)
    return _rows(np.concatenate([_bit_planes(L, 2), _crumb_qs(L), s, _fp16s(b, 4)], axis=-1))


# The i-quant _R4 forms keep each sub-block's grid indices, signs and scales, interleaved per row (4 k + i, or
# 8 k + i for IQ3_XXS's 8 index bytes); IQ2_XXS / IQ2_XS / IQ3_XXS store each 7-bit sign index s "scrambled":
# bit j = the parity of bits 0 .. j of s, undone by s = t ^ (t << 1).
def _unscramble(t: np.ndarray) -> np.ndarray:
    t = t.astype(np.uint32)
    return (t ^ (t << 1)) & 0x7F


def _xxs_sas(sas: np.ndarray) -> np.ndarray:
    """IQ2_XXS / IQ3_XXS _R4 sas[128] (u32 4 ib + k: byte j = scrambled sign index j << 1 | scale bit j) -> each
    row's 8 words (7-bit signs at 7 j, the 4-bit scale at 28) as bytes [G, nb, 4, 32]."""
    G, nb = sas.shape[:2]
    w = sas.reshape(G, nb, 8, 4, 4).transpose(0, 1, 3, 2, 4)            # [k, ib, byte j]
    word = np.zeros((G, nb, 4, 8), np.uint32)
    for j in range(4):
        word |= (_unscramble(w[..., j] >> 1) << (7 * j)) | ((w[..., j].astype(np.uint32) & 1) << (28 + j))
    return word.view(np.uint8).reshape(G, nb, 4, 32)


def _by_row(a: np.ndarray, per: int) -> np.ndarray:
    """Bytes laid (ib, k, i) with ``per`` bytes i each -> [G, nb, 4 (k), ib * per]."""
    return a.reshape(*a.shape[:2], -1, 4, per).transpose(0, 1, 3, 2, 4).reshape(*a.shape[:2], 4, -1)


def iq2_xxs_r4(b: np.ndarray) -> np.ndarray:
    """d[4], sas[128], qs[128] (4 grid index bytes of sub-block ib, row k at 16 ib + 4 k)."""
    idx = _by_row(b[..., 136:], 4).reshape(*b.shape[:2], 4, 8, 4)
    words = _xxs_sas(b[..., 8:136]).reshape(*b.shape[:2], 4, 8, 4)
    return _rows(np.concatenate([_fp16s(b, 4), np.concatenate([idx, words], axis=-1).reshape(*b.shape[:2], 4, 64)],
                                axis=-1))


def iq2_xs_r4(b: np.ndarray) -> np.ndarray:
    """d[4], qs[128] u16 (9-bit grid index | scrambled signs << 9; row k's sub-block ib at 16 ib + 4 k), scales[32]
    (4 ib + k)."""
    q = _by_row(b[..., 8:264].view(np.uint16), 4)                          # [G, nb, 4, 32]
    q = (q & 511) | (_unscramble(q >> 9).astype(np.uint16) << 9)
    return _rows(np.concatenate([_fp16s(b, 4), q.astype(np.uint16).view(np.uint8), _by_row(b[..., 264:], 1)], axis=-1))


def iq2_s_r4(b: np.ndarray) -> np.ndarray:
    """d[4], qs[128], qh[32], signs[128], scales[32]: bytes of row k's sub-block ib at 16 ib + 4 k (qh, scales:
    4 ib + k)."""
    return _rows(np.concatenate([_fp16s(b, 4), _by_row(b[..., 8:136], 4), _by_row(b[..., 168:296], 4),
                                 _by_row(b[..., 136:168], 1), _by_row(b[..., 296:], 1)], axis=-1))


def iq3_xxs_r4(b: np.ndarray) -> np.ndarray:
    """d[4], sas[128], qs[256] (8 grid index bytes of sub-block ib, row k at 32 ib + 8 k)."""
    return _rows(np.concatenate([_fp16s(b, 4), _by_row(b[..., 136:], 8), _xxs_sas(b[..., 8:136])], axis=-1))


def iq3_s_r4(b: np.ndarray) -> np.ndarray:
    """d[4], qs[256] (row k's index byte 8 ib + 4 h + i at 32 ib + 8 i + 4 h + k), qh[32] (4 ib + k), signs[128]
    (byte 16 ib + 4 k + i, bit 2 m + t = bit 4 t + i of row k's signs[4 ib + m]), scales[16] (4-bit fields
    8 ib + 4 h + k, ib < 4)."""
    G, nb = b.shape[:2]
    qs = b[..., 8:264].reshape(G, nb, 8, 4, 2, 4).transpose(0, 1, 5, 2, 4, 3).reshape(G, nb, 4, 64)
    sg = b[..., 296:424].reshape(G, nb, 8, 4, 4).transpose(0, 1, 3, 2, 4)  # [k, ib, i]
    signs = np.zeros((G, nb, 4, 8, 4), np.uint8)                            # [k, ib, m]
    for m in range(4):
        for t in range(2):
            for i in range(4):
                signs[..., m] |= ((sg[..., i] >> (2 * m + t)) & 1) << (4 * t + i)
    sc = _per_row(_fields(b[..., 424:], 4), 4, 2)                           # [G, nb, 4, 8] (ib, h)
    return _rows(np.concatenate([_fp16s(b, 4), qs, _by_row(b[..., 264:296], 1), signs.reshape(G, nb, 4, 32),
                                 sc[..., 0::2] | (sc[..., 1::2] << 4)], axis=-1))


# ik's type name -> (type id, base type, rows interleaved R, rebuild)
REPACKED: Dict[str, Tuple[int, str, int, Callable[[np.ndarray], np.ndarray]]] = {
    "Q4_0_R8": (202, "Q4_0", 8, q4_0_r8),
    "Q5_0_R4": (206, "Q5_0", 4, q5_0_r4),
    "Q8_0_R8": (208, "Q8_0", 8, q8_0_r8),
    "Q2_K_R4": (210, "Q2_K", 4, q2_k_r4),
    "Q3_K_R4": (211, "Q3_K", 4, q3_k_r4),
    "Q4_K_R4": (212, "Q4_K", 4, q4_k_r4),
    "Q5_K_R4": (213, "Q5_K", 4, q5_k_r4),
    "Q6_K_R4": (214, "Q6_K", 4, q6_k_r4),
    "IQ2_XXS_R4": (216, "IQ2_XXS", 4, iq2_xxs_r4),
    "IQ2_XS_R4": (217, "IQ2_XS", 4, iq2_xs_r4),
    "IQ3_XXS_R4": (218, "IQ3_XXS", 4, iq3_xxs_r4),
    "IQ4_NL_R4": (220, "IQ4_NL", 4, iq4_nl_r4),
    "IQ3_S_R4": (221, "IQ3_S", 4, iq3_s_r4),
    "IQ2_S_R4": (222, "IQ2_S", 4, iq2_s_r4),
    "IQ4_XS_R8": (223, "IQ4_XS", 8, iq4_xs_r8),
    "Q6_0_R4": (233, "Q6_0", 4, q6_0_r4),
    "IQ2_K_R4": (337, "IQ2_K", 4, iq2_k_r4),
    "IQ3_K_R4": (338, "IQ3_K", 4, iq3_k_r4),
    "IQ4_K_R4": (339, "IQ4_K", 4, iq4_k_r4),
    "IQ5_K_R4": (340, "IQ5_K", 4, iq5_k_r4),
    "IQ4_KS_R4": (344, "IQ4_KS", 4, iq4_ks_r4),
    "IQ5_KS_R4": (352, "IQ5_KS", 4, iq5_ks_r4),
}
# Bytes at the start of each row (a float32 row scale) for the types that have them; a group of R rows starts with
# its R row scales.
ROW_HEAD = {"IQ4_KS_R4": 4, "IQ5_KS_R4": 4}


def base_rows(typ: str, raw: np.ndarray, N: int, nb: int, size: int) -> np.ndarray:
    """Rows [N, row bytes] of repacked type ``typ`` -> the base type's rows [N, row bytes] (row scale, blocks)."""
    _, _, R, rebuild = REPACKED[typ]
    head = ROW_HEAD.get(typ, 0)
    g = np.asarray(raw, np.uint8).reshape(N // R, R * (head + nb * size))
    blocks = rebuild(g[:, R * head:].reshape(N // R, nb, R * size)).reshape(N, nb * size)
    return np.concatenate([g[:, :R * head].reshape(N, head), blocks], axis=1) if head else blocks
