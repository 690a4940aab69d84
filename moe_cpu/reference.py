"""Plain NumPy reference of the moe_cpu numerics contract (DESIGN.md section 5, docs/API.md).

Written independently of the C++ core: it needs NumPy only and imports nothing else from moe_cpu.
Readability beats speed here.

Conventions
- Quantization and rounding steps follow the float32 rules of the contract exactly (the same float32
  divisions, np.rint = round half to even), so codes and scales are bit-exact with `quantize_experts`.
- Everything else (dot products, bias, activation math, router weights, the top-k sum) is float64, so the
  reference adds no accumulation error of its own. Integer dot products are exact (int64).
- Where the contract keeps a value in fp32 between steps (GEMM1 output, activation output), the reference
  casts its float64 value to float32 at that point, then quantizes or rounds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SCHEMES = ("int4_w4a8", "int8_w8a8", "fp8_w8a16", "bf16", "int4_w4a16", "int8_w8a16")
A8 = ("int4_w4a8", "int8_w8a8")       # int weights, int8 activations per token
A16 = ("int4_w4a16", "int8_w8a16")    # the same weights, int16 activations per token
INT_SCHEMES = A8 + A16
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swiglustep", "swigluoai", "swigluoai_uninterleave")
# dynamic_4bit_int_moe activation_kind -> activation name (DESIGN.md section 5).
DYNAMIC_4BIT_ACTIVATION = {0: "silu", 1: "swigluoai_uninterleave", 2: "silu"}
E4M3_MAX = 448.0
SWIGLU_LIMIT = 7.0     # swiglustep / swigluoai clamp
SWIGLUOAI_ALPHA = 1.702


# ----------------------------------------------------------------------------------------------
# bfloat16
# ----------------------------------------------------------------------------------------------
def float_to_bf16_bits(x):
    """float32 -> uint16 bfloat16 bits, round to nearest even. NaN stays a (quiet) NaN, inf stays inf."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    lsb = (u >> 16) & 1                                   # ties go to the even upper half
    rounded = ((u + 0x7FFF + lsb) >> 16) & 0xFFFF
    quiet_nan = (u >> 16) | 0x0040                        # keep sign and payload top, force quiet bit
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_float(u16):
    """uint16 bfloat16 bits (or an ml_dtypes.bfloat16 array) -> float32 values (exact)."""
    u = np.asarray(u16)
    if u.dtype.name == "bfloat16":
        u = u.view(np.uint16)
    if u.dtype != np.uint16:
        raise TypeError(f"expected uint16 bf16 bits, got {u.dtype}")
    return (u.astype(np.uint32) << 16).view(np.float32)


def bf16_round(x):
    """float32 -> float32 rounded to the nearest bfloat16 value (ties to even; NaN preserved)."""
    return bf16_bits_to_float(float_to_bf16_bits(x))


def to_float32_values(a):
    """float32 array as is; bf16 (uint16 bits or ml_dtypes.bfloat16) decoded to float32 values."""
    a = np.asarray(a)
    if a.dtype == np.uint16 or a.dtype.name == "bfloat16":
        return bf16_bits_to_float(a)
    return a.astype(np.float32, copy=False)


# ----------------------------------------------------------------------------------------------
# float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf; 0x7f / 0xff are NaN; max 448
# ----------------------------------------------------------------------------------------------
def e4m3fn_to_float(codes):
    """uint8 e4m3fn codes (or an ml_dtypes.float8_e4m3fn array) -> float32 values, decoded bit by bit."""
    c = np.asarray(codes)
    if c.dtype.name == "float8_e4m3fn":
        c = c.view(np.uint8)
    c = c.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = (c & 0x7).astype(np.float64)
    normal = np.ldexp(1.0 + man / 8.0, exp - 7)
    subnormal = np.ldexp(man / 8.0, -6)                  # exponent field 0: 0.mmm * 2^-6
    val = sign * np.where(exp == 0, subnormal, normal)
    val = np.where((c & 0x7F) == 0x7F, np.copysign(np.nan, sign), val)
    return val.astype(np.float32)


# All 127 non-negative finite values, ascending; index == code (codes 0x00..0x7e).
_E4M3_POSITIVE = e4m3fn_to_float(np.arange(0x7F, dtype=np.uint8)).astype(np.float64)


def float_to_e4m3fn(x):
    """float32 -> uint8 e4m3fn codes: round to nearest, ties to even code, saturating to +-448.

    Works by picking the nearer of the two neighbouring table values (exact in float64). The sign is
    kept, so small negatives give -0 (0x80). NaN gives 0x7f/0xff; +-inf saturates to +-448.
    """
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x).astype(np.float64), E4M3_MAX)
    hi = np.searchsorted(_E4M3_POSITIVE, np.nan_to_num(a), side="left")   # first value >= a
    hi = np.minimum(hi, 0x7E)
    lo = np.maximum(hi - 1, 0)
    d_lo = a - _E4M3_POSITIVE[lo]
    d_hi = _E4M3_POSITIVE[hi] - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))            # even code = even mantissa
    code = np.where(take_hi, hi, lo)
    code = np.where(np.isnan(x), 0x7F, code)
    code = code | np.where(np.signbit(x), 0x80, 0)
    return code.astype(np.uint8)


# ----------------------------------------------------------------------------------------------
# Weight quantizers (API.md quantize_experts, all float32 arithmetic)
# ----------------------------------------------------------------------------------------------
def _groups(w, group_size):
    """[E,N,K] -> [E,N,G,g] view; group_size -1 means one group over all of K."""
    E, N, K = w.shape
    g = K if group_size == -1 else int(group_size)
    if g <= 0 or K % g:
        raise ValueError(f"group_size {group_size} must divide K={K} (or be -1)")
    return w.reshape(E, N, K // g, g)


def _symmetric(w, group_size, qmax, qmin):
    w = np.ascontiguousarray(w, dtype=np.float32)
    wg = _groups(w, group_size)
    amax = np.max(np.abs(wg), axis=-1)
    s = amax / np.float32(qmax)                           # float32 division
    s = np.where(amax == 0, np.float32(1), s).astype(np.float32)   # all-zero group -> s = 1
    q = np.clip(np.rint(wg / s[..., None]), qmin, qmax)  # float32 division, half to even
    return q.astype(np.int8).reshape(w.shape), s


def quantize_int4(w, group_size=128):
    """float32 [E,N,K] -> (q int8 [E,N,K] in [-8,7], scales float32 [E,N,G]).

    s = amax(group)/7, q = clamp(rint(w/s), -8, 7); group_size -1 = per channel (G = 1).
    """
    return _symmetric(w, group_size, 7, -8)


def quantize_int8(w, group_size=-1):
    """float32 [E,N,K] -> (q int8 [E,N,K] in [-127,127], scales float32 [E,N,G]); s = amax(group)/127."""
    return _symmetric(w, group_size, 127, -127)


def quantize_int4_zp(w, group_size=128):
    """Asymmetric int4 (test-data helper, not a quantize_experts rule) -> (q uint8 [0,15], scales, zeros uint8).

    s = (max(w,0) - min(w,0))/15, zero = clamp(rint(-min/s), 0, 15), q = clamp(rint(w/s) + zero, 0, 15).
    """
    w = np.ascontiguousarray(w, dtype=np.float32)
    wg = _groups(w, group_size)
    lo = np.minimum(wg.min(axis=-1), 0).astype(np.float32)
    hi = np.maximum(wg.max(axis=-1), 0).astype(np.float32)
    s = (hi - lo) / np.float32(15)
    s = np.where(s == 0, np.float32(1), s).astype(np.float32)
    z = np.clip(np.rint(-lo / s), 0, 15)
    q = np.clip(np.rint(wg / s[..., None]) + z[..., None], 0, 15)
    return q.astype(np.uint8).reshape(w.shape), s, z.astype(np.uint8)


def _expand_blocks(scale, bn, bk, N, K):
    """[..., ceil(N/bn), ceil(K/bk)] -> [..., N, K] by repeating each block's value."""
    return np.repeat(np.repeat(scale, bn, axis=-2), bk, axis=-1)[..., :N, :K]


def quantize_fp8(w, block=(128, 128)):
    """float32 [E,N,K] -> (codes uint8, scale_inv float32 [E, ceil(N/bn), ceil(K/bk)]).

    s = amax(block)/448 (all-zero block -> 1), codes = e4m3fn(w/s) round to nearest even.
    Edge blocks (N or K not a multiple of the block) cover what is left.
    """
    w = np.ascontiguousarray(w, dtype=np.float32)
    E, N, K = w.shape
    bn, bk = block
    nb, kb = -(-N // bn), -(-K // bk)
    padded = np.zeros((E, nb * bn, kb * bk), np.float32)   # zero padding leaves amax unchanged
    padded[:, :N, :K] = np.abs(w)
    amax = padded.reshape(E, nb, bn, kb, bk).max(axis=(2, 4))
    s = amax / np.float32(E4M3_MAX)
    s = np.where(amax == 0, np.float32(1), s).astype(np.float32)
    codes = float_to_e4m3fn(w / _expand_blocks(s, bn, bk, N, K))
    return codes, s


def quantize_bf16(w):
    """float32 [E,N,K] -> uint16 bf16 bits, round to nearest even."""
    return float_to_bf16_bits(w)


def _quantize_activations(x, qmax, dtype):
    """Per-row symmetric quantization: s = amax(row)/qmax (float32), q = clamp(rint(x/s), -qmax, qmax) (float32
    division, half to even). A row of zeros gets s = 1 (and q = 0), so nothing divides by zero."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    s = amax / np.float32(qmax)
    s = np.where(amax == 0, np.float32(1), s).astype(np.float32)
    q = np.clip(np.rint(x / s[:, None]), -qmax, qmax).astype(dtype)
    return q, s


def quantize_activations_int16(x):
    """A16's per-row int16 activation quantization: float32 [R,K] -> (q int16 [R,K], s float32 [R]), qmax 32767."""
    return _quantize_activations(x, 32767, np.int16)


def quantize_activations_int8(x):
    """Per-row int8 activation quantization: float32 [R,K] -> (q int8 [R,K], s float32 [R]), qmax 127."""
    return _quantize_activations(x, 127, np.int8)


def quantize_activations_int8_blocks(x, block):
    """A8 activation blocks: each run of `block` channels of each row quantized as a row of its own (s = amax/127,
    1 if all zero; q = clamp(rint(x/s), -127, 127), float32 division, half to even).
    float32 [R,K] (K % block == 0) -> (q int8 [R,K], s float32 [R, K // block])."""
    x = np.asarray(x, dtype=np.float32)
    R, K = x.shape
    if block <= 0 or K % block:
        raise ValueError(f"activation block {block} does not divide K = {K}")
    q, s = _quantize_activations(x.reshape(R * (K // block), block), 127, np.int8)
    return q.reshape(R, K), s.reshape(R, K // block)


# ----------------------------------------------------------------------------------------------
# Quantized weights
# ----------------------------------------------------------------------------------------------
@dataclass
class RefWeights:
    """One quantized expert tensor [E,N,K] as the reference sees it.

    scheme: one of SCHEMES. codes: int8 (int4/int8; uint8 0..15 for int4 with zeros or a codebook), uint8
    e4m3fn codes (fp8) or uint16 bits (bf16). scales: float32 [E,N,G] (int), [E,ceil(N/bn),ceil(K/bk)] (fp8),
    None (bf16). zeros: uint8 [E,N,G] or None. group_size: g or -1 (int schemes). block: (bn, bk) for fp8.
    codebook: int4 only, 16 ints: the value of each code, or None. mins: float32 [E,N,G] group offsets
    (the weight is value * scale - min), or None. g_idx: int [E,K] (int schemes, GPTQ act-order): the
    scale group of each input channel, or None for contiguous groups (channel k in group k // g).
    """
    scheme: str
    codes: np.ndarray
    scales: np.ndarray | None = None
    zeros: np.ndarray | None = None
    group_size: int = -1
    block: tuple | None = None
    codebook: np.ndarray | None = None
    mins: np.ndarray | None = None
    g_idx: np.ndarray | None = None
    act_block: int | None = None   # A8 schemes: one activation scale per act_block channels of a row (None: per row)

    @property
    def shape(self):
        return self.codes.shape

    @property
    def group(self):
        """Effective group length along K (K itself for per channel)."""
        return self.codes.shape[2] if self.group_size == -1 else self.group_size

    @classmethod
    def int4(cls, qweight, scales, group_size=128, zeros=None, codebook=None, mins=None, g_idx=None,
             scheme="int4_w4a8", act_block=None):
        """int4_w4a8 (or int4_w4a16): qweight int8 [-8,7] (or uint8 [0,15] with zeros or codebook), scales
        f32/bf16 [E,N,G]."""
        if scheme not in ("int4_w4a8", "int4_w4a16"):
            raise ValueError(f"int4 weights run as int4_w4a8 or int4_w4a16, not {scheme!r}")
        return cls._int(scheme, qweight, scales, group_size, zeros, codebook, mins, g_idx, act_block)

    @classmethod
    def int8(cls, qweight, scales, group_size=-1, mins=None, g_idx=None, scheme="int8_w8a8", act_block=None):
        """int8_w8a8 (or int8_w8a16): qweight int8, scales [E,N], [E,N,1] or [E,N,K//g]."""
        if scheme not in ("int8_w8a8", "int8_w8a16"):
            raise ValueError(f"int8 weights run as int8_w8a8 or int8_w8a16, not {scheme!r}")
        return cls._int(scheme, qweight, scales, group_size, None, None, mins, g_idx, act_block)

    @classmethod
    def _int(cls, scheme, qweight, scales, group_size, zeros, codebook=None, mins=None, g_idx=None, act_block=None):
        q = np.asarray(qweight)
        E, N, K = q.shape
        s = to_float32_values(scales).reshape(E, N, -1)
        z = None if zeros is None else np.asarray(zeros).astype(np.uint8).reshape(E, N, -1)
        cb = None if codebook is None else np.asarray(codebook, np.int64).reshape(16)
        m = None if mins is None else to_float32_values(mins).reshape(E, N, -1)
        gi = None if g_idx is None else np.broadcast_to(np.asarray(g_idx, np.int64), (E, K))
        w = cls(scheme, q, s, z, int(group_size), None, cb, m, gi, act_block)
        if s.shape[2] != K // w.group:
            raise ValueError(f"scales {s.shape} do not match K={K} and group_size={group_size}")
        if act_block is not None and (scheme in A16 or K % act_block or gi is not None):
            raise ValueError(f"act_block = {act_block}: A8 weights without g_idx whose K ({K}) it divides")
        return w

    @classmethod
    def fp8(cls, codes, scale_inv, block=(128, 128)):
        """fp8_w8a16: uint8 e4m3fn codes [E,N,K], scale_inv float32 [E,ceil(N/bn),ceil(K/bk)]."""
        c = np.asarray(codes)
        if c.dtype.name == "float8_e4m3fn":
            c = c.view(np.uint8)
        return cls("fp8_w8a16", c, np.asarray(scale_inv, np.float32), None, block[1], tuple(block))

    @classmethod
    def bf16(cls, bits):
        """bf16: uint16 bits (or ml_dtypes.bfloat16) [E,N,K]."""
        b = np.asarray(bits)
        if b.dtype.name == "bfloat16":
            b = b.view(np.uint16)
        return cls("bf16", b, None, None, -1, None)

    @classmethod
    def quantize(cls, w, scheme, group_size=None, block=(128, 128), act_block=None):
        """Quantize float32 [E,N,K] with the quantize_experts rules (same defaults)."""
        if scheme in ("int4_w4a8", "int4_w4a16"):
            g = 128 if group_size is None else group_size
            return cls.int4(*quantize_int4(w, g), group_size=g, scheme=scheme, act_block=act_block)
        if scheme in ("int8_w8a8", "int8_w8a16"):
            g = -1 if group_size is None else group_size
            return cls.int8(*quantize_int8(w, g), group_size=g, scheme=scheme, act_block=act_block)
        if scheme == "fp8_w8a16":
            return cls.fp8(*quantize_fp8(w, block), block=block)
        if scheme == "bf16":
            return cls.bf16(quantize_bf16(w))
        raise ValueError(f"unknown scheme {scheme!r}")

    def _int_codes(self, e):
        """Expert e's integer codes with zero points removed: int64 [N,K]."""
        q = self.codes[e].astype(np.int64)
        if self.codebook is not None:
            return self.codebook[q]
        if self.zeros is not None:
            q = q - self._per_channel(self.zeros[e].astype(np.int64), e)
        return q

    def _per_channel(self, v, e):
        """Group values v [N,G] of expert e spread to its channels [N,K]."""
        if self.g_idx is None:
            return np.repeat(v, self.group, axis=1)
        return v[:, self.g_idx[e]]

    def dequantize(self):
        """float64 [E,N,K]: (q - zero) * scale, e4m3(code) * scale_inv, or the bf16 value (all exact)."""
        E, N, K = self.codes.shape
        if self.scheme in INT_SCHEMES:
            w = np.stack([self._int_codes(e) * self._per_channel(self.scales[e].astype(np.float64), e)
                          for e in range(E)])
            if self.mins is not None:
                w -= np.stack([self._per_channel(self.mins[e].astype(np.float64), e) for e in range(E)])
            return w
        if self.scheme == "fp8_w8a16":
            bn, bk = self.block
            s = _expand_blocks(self.scales.astype(np.float64), bn, bk, N, K)
            return e4m3fn_to_float(self.codes).astype(np.float64) * s
        return bf16_bits_to_float(self.codes).astype(np.float64)

    def linear(self, e, a):
        """One expert's GEMM as the scheme defines it: float32 rows a [R,K] -> float64 [R,N] (x @ W[e]^T).

        int: per-row int8 (A16: int16) activations, exact integer dots per weight group, x group scale, summed,
        x row scale. A8 with act_block: int8 codes per block of act_block channels, each with its scale; the
        result is the float64 product of those dequantized activations and the dequantized weights.
        fp8: bf16-rounded activations, dot per K block with e4m3 values, x the block's scale_inv.
        bf16: bf16-rounded activations x bf16 weights.
        """
        a = np.asarray(a, dtype=np.float32)
        R, K = a.shape
        N = self.codes.shape[1]
        if self.scheme in INT_SCHEMES and self.act_block is not None:
            qa, sa = quantize_activations_int8_blocks(a, self.act_block)
            xa = qa.astype(np.float64) * np.repeat(sa.astype(np.float64), self.act_block, axis=1)
            we = self._int_codes(e) * self._per_channel(self.scales[e].astype(np.float64), e)
            if self.mins is not None:
                we = we - self._per_channel(self.mins[e].astype(np.float64), e)
            return xa @ we.T
        if self.scheme in INT_SCHEMES:
            qa, sa = quantize_activations_int16(a) if self.scheme in A16 else quantize_activations_int8(a)
            G = K // self.group
            # channel k belongs to group k // g, or g_idx[e, k] (act-order): exact int64 dots per group
            grp = np.arange(K) // self.group if self.g_idx is None else self.g_idx[e]
            qa64, qw = qa.astype(np.int64), self._int_codes(e)
            dots = np.stack([qa64[:, grp == gi] @ qw[:, grp == gi].T for gi in range(G)]).astype(np.float64)
            y = np.einsum("grn,ng->rn", dots, self.scales[e].astype(np.float64))
            if self.mins is not None:   # sum over k of a * min = min * (group code sum) * row scale
                asum = np.stack([qa64[:, grp == gi].sum(axis=1) for gi in range(G)], axis=1).astype(np.float64)
                y -= asum @ self.mins[e].astype(np.float64).T
            return y * sa.astype(np.float64)[:, None]
        ab = bf16_round(a).astype(np.float64)
        if self.scheme == "fp8_w8a16":
            bn, bk = self.block
            wv = e4m3fn_to_float(self.codes[e]).astype(np.float64)
            row_scale = np.repeat(self.scales[e].astype(np.float64), bn, axis=0)[:N]  # [N, K blocks]
            y = np.zeros((R, N))
            for kb in range(row_scale.shape[1]):
                ks = slice(kb * bk, min(K, (kb + 1) * bk))
                y += (ab[:, ks] @ wv[:, ks].T) * row_scale[None, :, kb]
            return y
        return ab @ bf16_bits_to_float(self.codes[e]).astype(np.float64).T


# ----------------------------------------------------------------------------------------------
# Activations (float64 in, float64 out)
# ----------------------------------------------------------------------------------------------
_erf = np.frompyfunc(math.erf, 1, 1)


def _sigmoid(v):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-v))


def _silu(g):
    return g * _sigmoid(g)


def activation_ref(y, activation="silu"):
    """Gated activation of the GEMM1 output y [R, 2I] -> [R, I], float64 (DESIGN.md section 5 table).

    Gate g = y[:, :I] and up u = y[:, I:], except swigluoai, which is interleaved (g = y[:, 0::2],
    u = y[:, 1::2]).
    """
    y = np.asarray(y, dtype=np.float64)
    I = y.shape[1] // 2
    if activation == "swigluoai":
        g, u = y[:, 0::2], y[:, 1::2]
    else:
        g, u = y[:, :I], y[:, I:]
    if activation == "silu":
        return _silu(g) * u
    if activation == "gelu":
        erf = np.asarray(_erf(g / math.sqrt(2.0)), dtype=np.float64).reshape(g.shape)
        return 0.5 * g * (1.0 + erf) * u
    if activation == "gelu_tanh":
        return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u
    if activation == "swiglustep":
        return np.minimum(_silu(g), SWIGLU_LIMIT) * np.clip(u, -SWIGLU_LIMIT, SWIGLU_LIMIT)
    if activation in ("swigluoai", "swigluoai_uninterleave"):
        g = np.minimum(g, SWIGLU_LIMIT)
        u = np.clip(u, -SWIGLU_LIMIT, SWIGLU_LIMIT)
        return (u + 1.0) * g * _sigmoid(SWIGLUOAI_ALPHA * g)
    raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")


# ----------------------------------------------------------------------------------------------
# Fused MoE
# ----------------------------------------------------------------------------------------------
def _local_ids(topk_ids, num_experts, expert_map):
    """Map ids to local experts: int64 [M,k], -1 where the slot contributes nothing."""
    ids = np.asarray(topk_ids).astype(np.int64)
    if expert_map is not None:
        em = np.asarray(expert_map).astype(np.int64)
        if np.any(ids >= len(em)):
            raise ValueError(f"topk_ids has ids >= {len(em)} global experts")
        ids = np.where(ids >= 0, em[np.clip(ids, 0, None)], -1)
    if np.any(ids >= num_experts):
        raise ValueError(f"topk_ids has ids >= {num_experts} experts")
    return ids


def _moe(x, topk_weights, topk_ids, num_experts, out_features, gemm1, gemm2, activation, on_input,
         w13_bias, w2_bias, expert_map, to_fp32):
    """Shared driver. x: [M,H] rows (float32 for the quantized reference, float64 for ground truth).

    gemm1/gemm2(e, rows) -> float64; to_fp32 marks where the contract holds values in fp32.
    """
    ids = _local_ids(topk_ids, num_experts, expert_map)
    w = np.asarray(topk_weights, dtype=np.float32)
    M, k = ids.shape
    contrib = np.zeros((M, k, out_features))          # skipped slots stay 0
    for e in range(num_experts):
        m, j = np.nonzero(ids == e)
        if len(m) == 0:
            continue
        a = x[m]
        if on_input:                                  # scale the input row (in x's dtype) before quantizing
            a = a * w[m, j, None].astype(a.dtype)
        y = gemm1(e, a)
        if w13_bias is not None:
            y = y + np.asarray(w13_bias, np.float32)[e].astype(np.float64)
        h = to_fp32(activation_ref(to_fp32(y), activation))
        z = gemm2(e, h)
        if w2_bias is not None:
            z = z + np.asarray(w2_bias, np.float32)[e].astype(np.float64)
        if not on_input:
            z = z * w[m, j, None].astype(np.float64)
        contrib[m, j] = z
    out = np.zeros((M, out_features))
    for j in range(k):                                # fixed order j = 0..k-1
        out += contrib[:, j]
    return out


def fused_experts_ref(hidden_states, w13, w2, topk_weights, topk_ids, activation="silu",
                      apply_router_weight_on_input=False, w13_bias=None, w2_bias=None, expert_map=None):
    """Quantized-path reference of moe_cpu.fused_experts -> float64 [M,H] (before the final rounding).

    hidden_states: float32, uint16 bf16 bits or ml_dtypes.bfloat16 [M,H]. w13 [E,2I,H], w2 [E,H,I]: RefWeights
    of one scheme, or int4 / int8 in any pair with the same activations (A8 with A8, A16 with A16). Ids < 0
    are skipped; with expert_map ids are global and local -1 is skipped.
    """
    if w13.scheme != w2.scheme and not any(w13.scheme in t and w2.scheme in t for t in (A8, A16)):
        raise ValueError(f"w13 is {w13.scheme} but w2 is {w2.scheme}")
    x = to_float32_values(hidden_states)
    return _moe(x, topk_weights, topk_ids, w13.codes.shape[0], w2.codes.shape[1], w13.linear, w2.linear,
                activation, apply_router_weight_on_input, w13_bias, w2_bias, expert_map,
                lambda v: np.asarray(v).astype(np.float32))


def fused_experts_float64(hidden_states, w13, w2, topk_weights, topk_ids, activation="silu",
                          apply_router_weight_on_input=False, w13_bias=None, w2_bias=None, expert_map=None):
    """Unquantized float64 ground truth: w13 [E,2I,H], w2 [E,H,I] float arrays, no rounding anywhere."""
    x = to_float32_values(hidden_states).astype(np.float64)
    w13 = np.asarray(w13, np.float64)
    w2 = np.asarray(w2, np.float64)
    return _moe(x, topk_weights, topk_ids, w13.shape[0], w2.shape[1], lambda e, a: a @ w13[e].T,
                lambda e, a: a @ w2[e].T, activation, apply_router_weight_on_input,
                w13_bias, w2_bias, expert_map, lambda v: np.asarray(v, np.float64))


def shared_expert_ref(hidden_states, w13, w2, fused_out, routed_scaling_factor=1.0):
    """fused_out * routed_scaling_factor + SiLU-FFN(hidden_states) of one shared expert (E = 1) -> float64.

    The FFN follows the scheme numerics of fused_experts_ref with k = 1 and router weight 1.
    """
    x = to_float32_values(hidden_states)
    M = x.shape[0]
    ffn = fused_experts_ref(x, w13, w2, np.ones((M, 1), np.float32), np.zeros((M, 1), np.int32), "silu")
    return to_float32_values(fused_out).astype(np.float64) * float(routed_scaling_factor) + ffn


# ----------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------
def _topk(scores, k):
    """Indices of the k largest per row, descending; ties to the lower index (stable sort)."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


def _softmax(v):
    v = v - v.max(axis=-1, keepdims=True)
    ev = np.exp(v)
    return ev / ev.sum(axis=-1, keepdims=True)


def select_experts_ref(router_logits, top_k, renormalize=False, scoring_func="softmax",
                       use_grouped_topk=False, num_expert_group=None, topk_group=None,
                       e_score_correction_bias=None, routed_scaling_factor=1.0):
    """Reference of moe_cpu.select_experts -> (weights float32 [M,k], ids int32 [M,k]).

    Computed in float64 from the float32 logits, following API.md "Routing" and DESIGN.md section 5.
    """
    logits = np.asarray(router_logits, np.float32).astype(np.float64)
    M, E = logits.shape
    if scoring_func == "softmax":
        scores = _softmax(logits)
    elif scoring_func == "sigmoid":
        scores = _sigmoid(logits)
    else:
        raise ValueError(f"unknown scoring_func {scoring_func!r}")
    bias = None
    if e_score_correction_bias is not None:
        bias = np.asarray(e_score_correction_bias, np.float32).astype(np.float64)
    sel = scores if bias is None else scores + bias      # the bias is for selection only

    if use_grouped_topk:
        G = int(num_expert_group)
        per = E // G
        gsel = sel.reshape(M, G, per)
        if bias is None:
            group_score = gsel.max(axis=-1)
        else:
            if per < 2:
                raise ValueError("e_score_correction_bias needs at least 2 experts per group (top-2 sum)")
            group_score = -np.sort(-gsel, axis=-1)[..., :2].sum(axis=-1)
        keep = _topk(group_score, int(topk_group))
        kept = np.zeros((M, G), bool)
        np.put_along_axis(kept, keep, True, axis=1)
        masked = np.where(np.repeat(kept, per, axis=1), sel, -np.inf)
        ids = _topk(masked, top_k)
        weights = np.take_along_axis(scores, ids, axis=1)
        if renormalize:
            weights = weights / weights.sum(axis=1, keepdims=True)
    elif scoring_func == "softmax" and bias is None:
        ids = _topk(logits, top_k)                      # select by raw logits
        chosen = np.take_along_axis(logits, ids, axis=1)
        if renormalize:
            weights = _softmax(chosen)
        else:
            mx = logits.max(axis=1, keepdims=True)
            lse = mx + np.log(np.exp(logits - mx).sum(axis=1, keepdims=True))
            weights = np.exp(chosen - lse)
    else:
        ids = _topk(sel, top_k)
        weights = np.take_along_axis(scores, ids, axis=1)
        if renormalize:
            weights = weights / weights.sum(axis=1, keepdims=True)
    weights = weights * float(routed_scaling_factor)
    return weights.astype(np.float32), ids.astype(np.int32)


def moe_align_block_size_ref(topk_ids, num_experts, block_size):
    """Reference of moe_cpu.moe_align_block_size -> (sorted_ids int32, expert_ids int32, num_tokens_post_pad).

    Slots s = m*k + j grouped by expert (ascending expert, ascending slot), each expert's run padded to a
    multiple of block_size with the value M*k; experts with no slots get no block. Ids < 0 are dropped.
    """
    ids = np.asarray(topk_ids).astype(np.int64).reshape(-1)
    if np.any(ids >= num_experts):
        raise ValueError(f"topk_ids has ids >= {num_experts} experts")
    pad = ids.size
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        slots = np.nonzero(ids == e)[0].tolist()
        n_blocks = -(-len(slots) // block_size)
        sorted_ids += slots + [pad] * (n_blocks * block_size - len(slots))
        expert_ids += [e] * n_blocks
    return (np.array(sorted_ids, np.int32), np.array(expert_ids, np.int32), len(sorted_ids))
