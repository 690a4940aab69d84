"""Load one MoE layer from a GGUF file (llama.cpp) with gguf's GGUFReader (memory-mapped).

GGUF lists dimensions innermost first: an expert tensor with ``ne = [K, N, E]`` is the row-major
array ``[E, N, K]``. Expert tensors: ``blk.L.ffn_{gate,up,down}_exps.weight`` (or the fused
``ffn_gate_up_exps.weight``, gate rows first), router ``blk.L.ffn_gate_inp.weight``, shared expert
``blk.L.ffn_{gate,up,down}_shexp.weight``, optional biases ``*.bias``, ``blk.L.exp_probs_b.bias``.

Types (all lossless but F16 / F32; ``unpack()`` equals ``gguf.quants.dequantize`` bit for bit):
- Q4_0 -> int4_w4a8 g32 (value = nibble - 8); Q8_0 -> int8_w8a8 g32;
- Q4_1 -> int4 g32, codes 0..15, mins (d * q + m: scale d, min -m); Q5_0 -> int8 g32 (q - 16);
  Q5_1 -> int8 g32 with mins;
- Q4_K -> int4 g32, codes 0..15, scale d * sc, min dmin * m (6-bit sc / m per 32 of a 256 block);
  Q5_K -> int8 g32 with the same scales and mins; Q6_K -> int8 group 16 (d * sc * (q - 32));
- IQ4_NL -> int4 g32 through its 16-value codebook; IQ4_XS -> the same with scale d * (ls - 32);
  MXFP4 -> int4 g32 through e2m1 x 2 = {0, +-1, +-2, +-3, +-4, +-6, +-8, +-12}, scale 2^(e - 128);
- the low-bit types (gguf_lowbit.py): Q2_K -> int8 g16 with mins, Q3_K -> int8 g16, TQ1_0 / TQ2_0 -> int8 g32 (2-bit split codes; int4 g256 where
  the int8 kernel takes none),
  IQ1_S / IQ2_XXS / IQ3_XXS / IQ3_S -> int4 g32 through their signed grid values, IQ1_M / IQ2_XS / IQ2_S -> int8 g16
  (more bytes than the file: docs/formats.md);
- ik_llama.cpp's own types (gguf_ik.py, type ids gguf-py does not know): Q6_0 -> int8 g32; IQ2_K, IQ3_K, IQ4_K,
  IQ5_K -> int8 g16; IQ2_KS, IQ3_KS, IQ4_KS, IQ5_KS, IQ4_KSS, IQ2_KL, IQ1_KT ... IQ4_KT (a scale at the start of each
  row) -> int8 g32; ik's row-interleaved _R4 / _R8 forms of these (Q4_0_R8 ... Q6_K_R4, IQ4_XS_R8, IQ2_XXS_R4 ...
  IQ3_S_R4, IQ2_K_R4 ... IQ5_KS_R4: gguf_repacked.py) -> their base type's blocks, rebuilt exactly, and its form;
- BF16 -> bf16 exactly; F16 and F32 are unquantized: quantized on load to ``scheme``, by default
  bf16 (rounded to nearest even, so F16 values with more than 8 significant bits change).
gate and up (and each of w13 / w2) keep their own form when they agree, and become int8 (codes
widened exactly) when they do not; w13 and w2 may differ (e.g. Q4_K gate/up with Q6_K down).
Any other type raises ``ValueError("unsupported GGUF type <NAME> for tensor <name>")`` when the layer needs that tensor
(types gguf-py does not know, such as ik_llama.cpp's others, by ik's name and id); tensors the layer does not read may hold
any type. A d field
that is NaN or infinite, or a tensor whose bytes do not fit its type and shape, raises ValueError.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from .._dtypes import from_bf16_bits
from ..forms import IQ1_VALUES, IQ2_VALUES, IQ3S_VALUES, IQ3XXS_VALUES, IQ4_NL_VALUES, MXFP4_VALUES, UNSIGNED4, mxfp4_scales
from ._gguf_blocks import Blocks, rows
from ._common import LayerWeights, Part, Source, build_experts, check_expert_ids, resolve_pair
from . import gguf_lowbit as lb
from .gguf_ik import IK_QUANT
from .gguf_repacked import REPACKED, base_rows
from .config import config_from_gguf

__all__ = ["load_gguf_layer"]



def _k_scale_min(b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the 8 six-bit scales and mins packed in 12 bytes b [..., 12] (float32 each)."""
    lo, hi = b[..., 0:4], b[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([b[..., 4:8] & 63, (hi >> 4) | ((b[..., 4:8] >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _five_bit(low4: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """32-element blocks: low 4 bits and bit 4 of element i = bit i of the little-endian u32 qh."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")          # [N, nb, 32]
    return low4 | (bits << 4)


def _q4_1(t: Blocks) -> Part:
    d, m = t.f16(0), t.f16(2, "m")
    return Part("int", rows(t.nibbles(4, 16)), d, mins=-m, codebook=UNSIGNED4)


def _q5_0(t: Blocks) -> Part:
    d = t.f16(0)
    q = _five_bit(t.nibbles(6, 16), t.b[..., 2:6]).astype(np.int8) - np.int8(16)
    return Part("int", rows(q), d)


def _q5_1(t: Blocks) -> Part:
    d, m = t.f16(0), t.f16(2, "m")
    return Part("int", rows(_five_bit(t.nibbles(8, 16), t.b[..., 4:8]).astype(np.int8)), d, mins=-m)


def _k_quant_scales(t: Blocks) -> Tuple[np.ndarray, np.ndarray]:
    d, dmin = t.f16(0), t.f16(2, "dmin")
    sc, mn = _k_scale_min(t.b[..., 4:16])
    return rows(d[..., None] * sc), rows(dmin[..., None] * mn)


def _q4_k(t: Blocks) -> Part:
    s, m = _k_quant_scales(t)
    q = np.concatenate([t.nibbles(16 + 32 * c, 32) for c in range(4)], axis=-1)   # 64 per 32 bytes
    return Part("int", rows(q), s, mins=m, codebook=UNSIGNED4)


def _q5_k(t: Blocks) -> Part:
    s, m = _k_quant_scales(t)
    low = np.concatenate([t.nibbles(48 + 32 * c, 32) for c in range(4)], axis=-1).reshape(*t.b.shape[:2], 8, 32)
    bit = (t.b[..., None, 16:48] >> np.arange(8, dtype=np.uint8)[:, None]) & 1    # sub-block j: bit j of qh[i]
    return Part("int", rows((low | (bit << 4)).astype(np.int8)), s, mins=m)


def _q6_k(t: Blocks) -> Part:
    d = t.f16(208)
    sc = t.b[..., 192:208].view(np.int8).astype(np.float32)
    halves = []
    for h in range(2):   # 128 elements per half: ql 64 bytes, qh 32 bytes
        ql, qh = t.b[..., 64 * h:64 * h + 64], t.b[..., 128 + 32 * h:160 + 32 * h]
        lo = [ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4]
        halves += [lo[i] | (((qh >> (2 * i)) & 3) << 4) for i in range(4)]
    q = np.concatenate(halves, axis=-1).astype(np.int8) - np.int8(32)
    return Part("int", rows(q), rows(d[..., None] * sc))


def _iq4_nl(t: Blocks) -> Part:
    return Part("int", rows(t.nibbles(2, 16)), t.f16(0), codebook=IQ4_NL_VALUES)


def _iq4_xs(t: Blocks) -> Part:
    d = t.f16(0)
    sh = np.ascontiguousarray(t.b[..., 2:4]).view(np.uint16)[..., 0]
    j = np.arange(8)
    ls = ((t.b[..., 4 + j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 15) | \
         (((sh[..., None] >> (2 * j).astype(np.uint16)) & 3) << 4).astype(np.uint8)
    q = np.concatenate([t.nibbles(8 + 16 * i, 16) for i in range(8)], axis=-1)
    return Part("int", rows(q), rows(d[..., None] * (ls.astype(np.float32) - 32)), codebook=IQ4_NL_VALUES)


def _mxfp4(t: Blocks) -> Part:
    return Part("int", rows(t.nibbles(1, 16)), mxfp4_scales(t.b[..., 0]), codebook=MXFP4_VALUES)


def _q4_0(t: Blocks) -> Part:
    return Part("int", rows(t.nibbles(2, 16).astype(np.int8) - np.int8(8)), t.f16(0))


def _q8_0(t: Blocks) -> Part:
    return Part("int", rows(np.ascontiguousarray(t.b[..., 2:]).view(np.int8)), t.f16(0))


@functools.lru_cache(maxsize=None)
def _tq_group() -> int:
    """TQ1_0 / TQ2_0's group: 32, as int8, where this CPU's int8 kernel holds codes of 3 values as 2-bit split codes
    (AVX2, AVX-512 VNNI, the Arm dot-product tiers, the reference: 2.31 bits a weight), else 256, as int4 (4.06 bits;
    int8 panels would take 9)."""
    from ..api import pack_int8

    q = np.tile(np.array([-1, 0, 1, 0], np.int8), (1, 16, 64))
    return 32 if pack_int8(q, np.ones((1, 16, 8), np.float32), 32).code_bits == 2 else 256


# type -> (native scheme, group, elements per block, bytes per block, decoder, codebook, mins)
_QUANT: Dict[str, Tuple[str, int, int, int, Callable[[Blocks], Part], Optional[tuple], bool]] = {
    "Q4_0": ("int4_w4a8", 32, 32, 18, _q4_0, None, False),
    "Q4_1": ("int4_w4a8", 32, 32, 20, _q4_1, UNSIGNED4, True),
    "Q5_0": ("int8_w8a8", 32, 32, 22, _q5_0, None, False),
    "Q5_1": ("int8_w8a8", 32, 32, 24, _q5_1, None, True),
    "Q8_0": ("int8_w8a8", 32, 32, 34, _q8_0, None, False),
    "Q4_K": ("int4_w4a8", 32, 256, 144, _q4_k, UNSIGNED4, True),
    "Q5_K": ("int8_w8a8", 32, 256, 176, _q5_k, None, True),
    "Q6_K": ("int8_w8a8", 16, 256, 210, _q6_k, None, False),
    "IQ4_NL": ("int4_w4a8", 32, 32, 18, _iq4_nl, IQ4_NL_VALUES, False),
    "IQ4_XS": ("int4_w4a8", 32, 256, 136, _iq4_xs, IQ4_NL_VALUES, False),
    "MXFP4": ("int4_w4a8", 32, 32, 17, _mxfp4, MXFP4_VALUES, False),
    # the low-bit types (gguf_lowbit.py)
    "Q2_K": ("int8_w8a8", 16, 256, 84, lb.q2_k, None, True),
    "Q3_K": ("int8_w8a8", 16, 256, 110, lb.q3_k, None, False),
    "TQ1_0": ("int4_w4a8", 256, 256, 54, lambda t: lb.tq1_0(t, _tq_group()), None, False),   # or int8 g32: _tq_group
    "TQ2_0": ("int4_w4a8", 256, 256, 66, lambda t: lb.tq2_0(t, _tq_group()), None, False),
    "IQ1_S": ("int4_w4a8", 32, 256, 50, lb.iq1_s, IQ1_VALUES, False),
    "IQ1_M": ("int4_w4a8", 16, 256, 56, lb.iq1_m, IQ1_VALUES, False),
    "IQ2_XXS": ("int4_w4a8", 32, 256, 66, lb.iq2_xxs, IQ2_VALUES, False),
    "IQ2_XS": ("int4_w4a8", 16, 256, 74, lb.iq2_xs, IQ2_VALUES, False),
    "IQ2_S": ("int4_w4a8", 16, 256, 82, lb.iq2_s, IQ2_VALUES, False),
    "IQ3_XXS": ("int4_w4a8", 32, 256, 98, lb.iq3_xxs, IQ3XXS_VALUES, False),
    "IQ3_S": ("int4_w4a8", 32, 256, 110, lb.iq3_s, IQ3S_VALUES, False),
}
# ik_llama.cpp's own types (gguf_ik.py): int8 codes of its tables in groups of 16 or 32 (int4 codes through a codebook
# where the table has 16 values or fewer); the *_KS types, IQ4_KSS and IQ2_KL start each row with its scale
# (_ROW_HEAD bytes).
_QUANT.update({t: (v[1], v[2], v[3], v[4], v[6], v[7], False) for t, v in IK_QUANT.items()})
_ROW_HEAD = {t: v[5] for t, v in IK_QUANT.items() if v[5]}
_FLOAT = ("BF16", "F16", "F32")
# ggml's vec-dot type of each weight type (ggml-cpu's type traits): Q8_0 / Q8_1 blocks of 32 (Q8_1 adds the block's
# sum, which the kernels keep exactly anyway), Q8_K blocks of 256 for the K-quants and IQ4_XS.
GGML_ACT_BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "IQ4_NL": 32, "MXFP4": 32,
                  "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256,
                  **{t: 256 for t in ("Q2_K", "Q3_K", "TQ1_0", "TQ2_0", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                      "IQ3_XXS", "IQ3_S")},
                  **{t: 32 if t == "Q6_0" or t.endswith("_KT") else 256 for t in IK_QUANT}}   # ik's Q8_2_X4 / Q8_K
# What a GGUF layer runs by default: ggml's block, or a finer one where ggml's is 256. Blocks of 32 give the
# K-quants and IQ4_XS about 1.2e-2 layer error against 1.8e-2 (ik_llama.cpp without run-time repack computes them
# with blocks of 32 too: bench/ik_peer.py, docs/performance.md, "How it is measured").
# The K-quants (Q2_K ... Q6_K) take 128, still finer than ggml's 256: on AVX2 the integer group scales then sum
# whole blocks of 4 groups of 32 or runs of 8 groups of 16 in int32 (docs/numerics.md), where blocks of 32 take an
# fp32 epilogue per group; on Zen 3 against 32, M = 512: Q4_K 177 -> 147 ms, Q5_K 198 -> 184, Q6_K 225 -> 185, Q2_K
# 214 -> 156, decode Q2_K 0.86 -> 0.56 ms; error 1.2e-2 -> 1.5-1.6e-2 (ik's 1.8e-2; docs/performance.md).
ACT_BLOCK = {t: min(b, 32) for t, b in GGML_ACT_BLOCK.items()} | {t: 128 for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")}


# Type ids that gguf-py may not know, by the names ik_llama.cpp gives them (its ggml_type_name), for the errors of a
# tensor moe_cpu cannot read. A file holding them elsewhere (an attention tensor in ik's Q6_0, say) still loads.
_IK_TYPES = {
    36: "I2_S", 41: "Q1_0_G128", 133: "Q6_0", 134: "IQ1_BN", 135: "IQ2_BN", 136: "Q8_K64", 137: "IQ2_K", 138: "IQ3_K",
    139: "IQ4_K", 140: "IQ5_K", 141: "IQ6_K", 144: "IQ4_KS", 145: "IQ2_KS", 146: "IQ4_KSS", 147: "Q8_K16",
    148: "Q8_K32", 149: "Q8_KR8", 150: "Q8_K128", 151: "Q8_KV", 152: "IQ5_KS", 153: "IQ2_KT", 154: "IQ3_KT",
    155: "IQ4_KT", 156: "IQ3_KS", 157: "IQ2_KL", 158: "IQ1_KT", 202: "Q4_0_R8", 206: "Q5_0_R4", 208: "Q8_0_R8",
    210: "Q2_K_R4", 211: "Q3_K_R4", 212: "Q4_K_R4", 213: "Q5_K_R4", 214: "Q6_K_R4", 216: "IQ2_XXS_R4",
    217: "IQ2_XS_R4", 218: "IQ3_XXS_R4", 219: "IQ1_S_R4", 220: "IQ4_NL_R4", 221: "IQ3_S_R4", 222: "IQ2_S_R4",
    223: "IQ4_XS_R8", 229: "IQ1_M_R4", 230: "BF16_R16", 233: "Q6_0_R4", 335: "IQ2_BN_R4", 337: "IQ2_K_R4",
    338: "IQ3_K_R4", 339: "IQ4_K_R4", 340: "IQ5_K_R4", 344: "IQ4_KS_R4", 352: "IQ5_KS_R4", 397: "Q8_K_R16",
    398: "Q8_KV_R8", 399: "Q8_K_R8",
}


class _ForeignType:
    """The type of a tensor whose type id gguf-py does not know: its name (ik_llama.cpp's where known) and id."""

    def __init__(self, tid: int):
        self.value = tid
        self.name = _IK_TYPES.get(tid, f"type id {tid}")

    def describe(self) -> str:
        return (f"{self.name} (type id {self.value}, an ik_llama.cpp type)" if self.value in _IK_TYPES
                else f"{self.name} (unknown to gguf-py and to ik_llama.cpp)")


class _ForeignTensor:
    """A tensor of a type gguf-py cannot size: name, type and shape; its data (uint8 [..., row bytes], as gguf-py
    shapes quantized data) where the type is an ik_llama.cpp type moe_cpu reads (moe_cpu refuses the others if a
    layer needs them)."""

    def __init__(self, name: str, tid: int, dims: np.ndarray):
        self.name, self.tensor_type, self.shape = name, _ForeignType(tid), dims
        self.data = None

    def locate(self, mm: np.ndarray, at: int) -> None:
        typ = _base(self.tensor_type.name)
        if typ not in _QUANT or not len(self.shape) or int(self.shape[0]) % _QUANT[typ][2]:
            return   # tensor() names the type or the shape
        ne = [int(x) for x in self.shape]
        row = _ROW_HEAD.get(typ, 0) + ne[0] // _QUANT[typ][2] * _QUANT[typ][3]
        n = int(np.prod(ne[1:], dtype=np.int64)) * row
        self.data = mm[at:at + n].reshape(*ne[:0:-1], row) if at + n <= len(mm) else mm[at:at + n]


def _reader(path: str) -> Any:
    """gguf's GGUFReader for ``path``, keeping tensors of type ids gguf-py does not know as _ForeignTensor entries
    instead of refusing the whole file (the other tensors' data are located by their own offsets)."""
    from gguf import GGML_QUANT_SIZES, GGUFReader

    known = {int(t) for t in GGML_QUANT_SIZES}

    class Reader(GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list) -> None:
            ours = [f for f in fields if int(f.parts[4][0]) in known]
            super()._build_tensors(start_offs, ours)
            names = {t.name for t in self.tensors}
            for f in fields:
                if int(f.parts[4][0]) not in known:
                    name = str(bytes(f.parts[1]), encoding="utf-8")
                    if name in names:
                        raise ValueError(f"Found duplicated tensor with name {name}")
                    names.add(name)
                    t = _ForeignTensor(name, int(f.parts[4][0]), f.parts[3])
                    t.locate(self.data, start_offs + int(f.parts[5][0]))
                    self.tensors.append(t)

    return Reader(path, "r")


def _type(t: Any) -> str:
    return t.tensor_type.name


def _base(typ: str) -> str:
    """The type whose blocks a repacked (_R4 / _R8) type interleaves; any other type itself."""
    return REPACKED[typ][1] if typ in REPACKED else typ


def _decode(t: Any, row: np.ndarray, N: int, K: int) -> Part:
    """One expert's [N, K] slice of GGUF tensor ``t`` (raw rows from the memory map) -> Part."""
    typ = _type(t)
    if typ in REPACKED:   # R rows interleaved: the base type's rows back
        row, typ = base_rows(typ, row, N, K // _QUANT[_base(typ)][2], _QUANT[_base(typ)][3]), _base(typ)
    if typ in _QUANT:
        _, _, blk, size, dec, _, _ = _QUANT[typ]
        head = _ROW_HEAD.get(typ, 0)
        if head:   # ik's row scale, then the row's blocks
            r = np.asarray(row, np.uint8).reshape(N, head + K // blk * size)
            return dec(Blocks(r[:, head:].reshape(N, K // blk, size), t.name, r[:, :head]))
        return dec(Blocks(np.asarray(row, np.uint8).reshape(N, K // blk, size), t.name))
    if typ == "BF16":
        return Part("float", from_bf16_bits(np.asarray(row).view(np.uint16).reshape(N, K)))
    return Part("float", np.asarray(row, np.float32).reshape(N, K))   # F16 / F32


def _values(p: Part) -> np.ndarray:
    """A Part's float32 values: value * scale - min (the same float32 operations as unpack())."""
    if p.kind == "float":
        return p.q
    v = np.asarray(p.codebook, np.int8)[p.q] if p.codebook is not None else p.q
    rep = p.q.shape[1] // p.scales.shape[1]
    out = v.astype(np.float32) * np.repeat(p.scales, rep, axis=1)
    return out - np.repeat(p.mins, rep, axis=1) if p.mins is not None else out


def _dequant(t: Any, name: str, shape: Tuple[int, ...]) -> np.ndarray:
    """A small tensor (router, biases) as float32 of ``shape``, decoded exactly."""
    rows = int(np.prod(shape[:-1]))
    return np.ascontiguousarray(_values(_decode(t, np.asarray(t.data).reshape(rows, -1), rows, shape[-1])).reshape(shape))


class _File:
    """A GGUF file: metadata lookups and shape-checked tensor access."""

    def __init__(self, path: str):
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise ImportError("loading .gguf files needs llama.cpp's 'gguf' package (pip install gguf)") from None
        try:
            self.r = _reader(path)
        except Exception as err:   # gguf raises ValueError / struct.error / others on bad files
            raise ValueError(f"{path}: not a readable GGUF file ({err})") from None
        self.path = path
        self.tensors = {t.name: t for t in self.r.tensors}

    def get(self, key: str) -> Any:
        f = self.r.fields.get(key)
        return None if f is None else f.contents()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str, ne: Tuple[int, ...], what: str = "") -> Any:
        """The tensor, after checking it exists, has a type we read, whole blocks per row, GGUF
        shape ``ne`` (innermost first) and the bytes its type and shape need."""
        t = self.tensors.get(name)
        if t is None:
            raise ValueError(f"missing tensor {name}{' (' + what + ')' if what else ''} in {self.path}")
        typ = _type(t)
        if typ in REPACKED:   # checked as its base type, plus whole groups of R rows
            R = REPACKED[typ][2]
            if len(t.shape) < 2 or int(t.shape[1]) % R:
                raise ValueError(f"tensor {name}: {typ} interleaves groups of {R} rows, but its matrices have "
                                 f"{int(t.shape[1]) if len(t.shape) > 1 else 1} rows")
            typ = _base(typ)
        if typ not in _QUANT and typ not in _FLOAT:
            what = t.tensor_type.describe() if isinstance(t, _ForeignTensor) else typ
            raise ValueError(f"unsupported GGUF type {what} for tensor {name}: moe_cpu reads "
                             f"{', '.join(list(_QUANT) + list(REPACKED) + list(_FLOAT))}")
        got = tuple(int(x) for x in t.shape)
        if typ in _QUANT and got and got[0] % _QUANT[typ][2]:
            raise ValueError(f"tensor {name}: {typ} packs blocks of {_QUANT[typ][2]} along its rows, but its rows "
                             f"have {got[0]} elements (a corrupted header or a mislabelled type)")
        if got != tuple(ne):
            raise ValueError(f"tensor {name}: GGUF shape (ne, innermost first) {list(got)} but {list(ne)} "
                             f"was expected, i.e. row-major {list(ne[::-1])}")
        rows = int(np.prod(ne[1:], dtype=np.int64))
        if typ in _QUANT:
            want = rows * (_ROW_HEAD.get(typ, 0) + ne[0] // _QUANT[typ][2] * _QUANT[typ][3])
        else:
            want = rows * ne[0] * {"BF16": 2, "F16": 2, "F32": 4}[typ]
        got_bytes = int(np.asarray(t.data).nbytes)
        if got_bytes != want:
            raise ValueError(f"tensor {name}: {got_bytes} bytes of data, but {typ} of shape {list(ne[::-1])} "
                             f"needs {want} (truncated or corrupted file)")
        return t

    def source(self, name: str, N: int, K: int, E: Optional[int]) -> Source:
        """Source over the experts of ``name`` ([E, N, K]; E None: a 2-D shared-expert tensor)."""
        t = self.tensor(name, (K, N) if E is None else (K, N, E))
        typ = _base(_type(t))
        if typ in _FLOAT:
            return Source(name, N, "float", -1, lambda e: _decode(t, t.data if E is None else t.data[e], N, K))
        native, g, _, _, _, cb, mins = _QUANT[typ]
        if typ in ("TQ1_0", "TQ2_0") and _tq_group() == 32:
            native, g = "int8_w8a8", 32
        return Source(name, N, native, g, lambda e: _decode(t, t.data if E is None else t.data[e], N, K), cb, mins,
                      act_block=ACT_BLOCK[typ])

    def vector(self, name: str, ne: Tuple[int, ...]) -> np.ndarray:
        return _dequant(self.tensor(name, ne), name, tuple(ne[::-1]))


def load_gguf_layer(path: Any, layer_idx: int, scheme: Optional[str] = None,
                    group_size: Optional[int] = None, block_size: Tuple[int, int] = (128, 128),
                    experts: Optional[Sequence[int]] = None, act_block: object = "auto") -> LayerWeights:
    """Load layer ``layer_idx`` of a GGUF file (see ``moe_cpu.loaders.load_layer``)."""
    path = os.fspath(path)
    f = _File(path)
    arch = f.get("general.architecture")
    if not arch:
        raise ValueError(f"{path}: required GGUF key 'general.architecture' is missing")
    n_layers = f.get(f"{arch}.block_count")
    if n_layers is not None and not 0 <= layer_idx < int(n_layers):
        raise ValueError(f"{path}: layer {layer_idx} is out of range ({arch}.block_count = {n_layers})")
    p = f"blk.{layer_idx}."
    if not f.has(p + "ffn_gate_inp.weight"):
        dense = f.get(f"{arch}.leading_dense_block_count") or 0
        if layer_idx < dense:
            raise ValueError(f"{path}: layer {layer_idx} is a dense block, not MoE "
                             f"({arch}.leading_dense_block_count = {dense})")
        raise ValueError(f"missing tensor {p}ffn_gate_inp.weight in {path}: layer {layer_idx} has no MoE router")
    E = f.get(f"{arch}.expert_count")
    if E is None:
        raise ValueError(f"{path}: required GGUF key '{arch}.expert_count' is missing")
    E = int(E)
    fused = f.has(p + "ffn_gate_up_exps.weight")
    up = p + ("ffn_gate_up_exps.weight" if fused else "ffn_up_exps.weight")
    if up not in f.tensors:
        raise ValueError(f"missing tensor {up} in {path}")
    # H and I from metadata when present, else from the tensors (validated below either way)
    ne_up = [int(x) for x in f.tensors[up].shape]
    H = int(f.get(f"{arch}.embedding_length") or ne_up[0])
    I = int(f.get(f"{arch}.expert_feed_forward_length") or (ne_up[1] // 2 if fused else ne_up[1]))
    conf = config_from_gguf(f.get, arch, layer_idx, H, I, path)

    if fused:
        w13_src = [f.source(up, 2 * I, H, E)]
    else:
        w13_src = [f.source(p + "ffn_gate_exps.weight", I, H, E), f.source(up, I, H, E)]
    w2_src = [f.source(p + "ffn_down_exps.weight", H, I, E)]
    s13, s2 = resolve_pair(w13_src, w2_src, scheme, f"layer {layer_idx} routed experts")
    ids = check_expert_ids(experts, E)
    w13 = build_experts(w13_src, E, H, s13, f"w13 ({w13_src[0].name}, ...)", group_size, block_size, ids, act_block)
    w2 = build_experts(w2_src, E, I, s2, f"w2 ({w2_src[0].name})", group_size, block_size, ids, act_block)
    forms = f"{w13.form}/{w2.form}" if w13 is not None else f"{s13}/{s2}"
    gate = f.vector(p + "ffn_gate_inp.weight", (H, E))

    # optional vectors
    opt = lambda name, ne: f.vector(name, ne) if f.has(name) else None  # noqa: E731
    if fused:
        w13_bias = opt(p + "ffn_gate_up_exps.bias", (2 * I, E))
    else:
        gb, ub = opt(p + "ffn_gate_exps.bias", (I, E)), opt(p + "ffn_up_exps.bias", (I, E))
        if (gb is None) != (ub is None):
            raise ValueError(f"missing tensor {p}ffn_{'up' if ub is None else 'gate'}_exps.bias "
                             f"(the other gate/up bias is present) in {path}")
        w13_bias = None if gb is None else np.ascontiguousarray(np.concatenate([gb, ub], axis=1))
    w2_bias = opt(p + "ffn_down_exps.bias", (H, E))

    shared = [None, None]
    if f.has(p + "ffn_gate_shexp.weight"):
        Is = int(f.tensors[p + "ffn_gate_shexp.weight"].shape[1])
        conf.shared_intermediate_size = Is
        s13 = [f.source(p + "ffn_gate_shexp.weight", Is, H, None), f.source(p + "ffn_up_shexp.weight", Is, H, None)]
        s2 = [f.source(p + "ffn_down_shexp.weight", H, Is, None)]
        sch13, sch2 = resolve_pair(s13, s2, scheme, f"layer {layer_idx} shared expert")
        shared = [build_experts(s13, 1, H, sch13, f"shared_w13 ({p}ffn_gate_shexp, ffn_up_shexp)",
                                group_size, block_size, act_block=act_block),
                  build_experts(s2, 1, Is, sch2, f"shared_w2 ({p}ffn_down_shexp)", group_size, block_size,
                                act_block=act_block)]
    elif conf.shared_intermediate_size:
        raise ValueError(f"missing tensor {p}ffn_gate_shexp.weight in {path}: "
                         f"{arch}.expert_shared_feed_forward_length declares a shared expert")
    else:
        conf.shared_intermediate_size = None
    return LayerWeights(w13=w13, w2=w2, gate=gate, config=conf, w13_bias=w13_bias, w2_bias=w2_bias,
                        shared_w13=shared[0], shared_w2=shared[1],
                        e_score_correction_bias=opt(p + "exp_probs_b.bias", (E,)),
                        gate_bias=opt(p + "ffn_gate_inp.bias", (E,)),
                        shared_expert_gate=opt(p + "ffn_gate_inp_shexp.weight", (H,)),
                        source=f"gguf {arch} {_type(f.tensors[w13_src[0].name])}/{_type(f.tensors[w2_src[0].name])} "
                               f"-> {forms} ({path})")
