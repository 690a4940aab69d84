"""ik_llama.cpp's row-interleaved types (``_R4`` / ``_R8``) back to their base type's blocks.

ik's ``llama-quantize`` can save a tensor with R consecutive rows interleaved block by block: for each block index,
one repacked block holds the R rows' blocks, their scales gathered at the front and their codes interleaved in 4-byte
runs (some types also regroup nibbles and 6-bit scales). Every such layout is a fixed permutation of the R base
blocks' bits, so the loader rebuilds the base blocks exactly and reads them as it reads the base type. Layouts:
ik's ``ggml-common.h`` and ``iqk_quantize.cpp`` (``repack_*``) at the commit of ``ik-llama-cpp-python`` 0.1.5.

Each function takes uint8 ``[G, nb, R * size]`` (G groups of R rows, nb blocks a row) and returns the base blocks
``[G * R, nb, size]`` (rows in order).
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


def _sub_scales(packed_h: np.ndarray, packed_l: np.ndarray, R: int, hbits: int) -> Tuple[np.ndarray, np.ndarray]:
    """The 4-bit low and ``hbits``-bit high parts of 8 R sub-block fields, field i = R ib + k at nibble i // 32 of
    low byte i % 32 and at bits hbits (i // 16) of high byte i % 16: [G, nb, R (k), 8 (ib)] each."""
    i = np.arange(8)[None, :] * R + np.arange(R)[:, None]          # [k, ib]
    lo = (packed_l[..., i % 32] >> (4 * (i // 32))) & 0xF
    hi = (packed_h[..., i % 16] >> (hbits * (i // 16))) & ((1 << hbits) - 1)
    return lo.astype(np.uint8), hi.astype(np.uint8)


def iq4_xs_r8(b: np.ndarray) -> np.ndarray:
    """d[8], scales_h[16], scales_l[32], qs[1024]. Sub-block ib of row k: low scale bits as field 8 ib + k of
    scales_l (4 bits) and high as field 8 ib + k of scales_h (2 bits); its codes in bytes 128 ib + 32 p + 4 k + i,
    p = 0 / 1: the low nibbles of qs[16 ib + 8 p + i] (low) and qs[16 ib + 8 p + 4 + i] (high), p = 2 / 3 the high
    nibbles of the same bytes."""
    G, nb = b.shape[:2]
    d = _fp16s(b, 8)
    sl, sh = _sub_scales(b[..., 16:32], b[..., 32:64], 8, 2)        # [G, nb, 8, 8]
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
    qh = np.zeros((*L.shape[:3], 32), np.uint8)
    for bit in range(8):
        qh |= (L[..., 32 * bit:32 * bit + 32] >> 4) << bit
    return _rows(np.concatenate([_fp16s(b, 4), _fp16s(b, 4, 8), _k_scales(b[..., 16:32], b[..., 32:64]), qh, _k_qs(L)],
                                axis=-1))


def q6_k_r4(b: np.ndarray) -> np.ndarray:
    """d[4], scales[64] (row k's scale 2 ib + h at 8 ib + 4 h + k), qh[256] (bits 5-6), ql[512]."""
    G, nb = b.shape[:2]
    sc = b[..., 8:72].reshape(G, nb, 8, 2, 4).transpose(0, 1, 4, 2, 3).reshape(G, nb, 4, 16)
    L = (_low_codes(b[..., 328:]) | (_high_codes(b[..., 72:328], _HIGH_Q6["Q6_K"], 2) << 4)).reshape(G, nb, 4, 2, 4, 32)
    ql = np.concatenate([(L[..., 0, :] & 0xF) | ((L[..., 2, :] & 0xF) << 4),
                         (L[..., 1, :] & 0xF) | ((L[..., 3, :] & 0xF) << 4)], axis=-1).reshape(G, nb, 4, 128)
    qh = (L[..., 0, :] >> 4) | ((L[..., 1, :] >> 4) << 2) | ((L[..., 2, :] >> 4) << 4) | ((L[..., 3, :] >> 4) << 6)
    return _rows(np.concatenate([ql, qh.reshape(G, nb, 4, 64), sc, _fp16s(b, 4)], axis=-1))


# ik's type name -> (type id, base type, rows interleaved R, rebuild)
REPACKED: Dict[str, Tuple[int, str, int, Callable[[np.ndarray], np.ndarray]]] = {
    "Q4_0_R8": (202, "Q4_0", 8, q4_0_r8),
    "Q5_0_R4": (206, "Q5_0", 4, q5_0_r4),
    "Q8_0_R8": (208, "Q8_0", 8, q8_0_r8),
    "Q4_K_R4": (212, "Q4_K", 4, q4_k_r4),
    "Q5_K_R4": (213, "Q5_K", 4, q5_k_r4),
    "Q6_K_R4": (214, "Q6_K", 4, q6_k_r4),
    "IQ4_NL_R4": (220, "IQ4_NL", 4, iq4_nl_r4),
    "IQ4_XS_R8": (223, "IQ4_XS", 8, iq4_xs_r8),
    "Q6_0_R4": (233, "Q6_0", 4, q6_0_r4),
}


def base_rows(typ: str, raw: np.ndarray, N: int, nb: int, size: int) -> np.ndarray:
    """Rows [N, nb * R * size / R] of repacked type ``typ`` -> their base blocks [N, nb, size]."""
    _, _, R, rebuild = REPACKED[typ]
    return rebuild(np.asarray(raw, np.uint8).reshape(N // R, nb, R * size))
