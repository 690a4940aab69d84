"""ik_llama.cpp's own GGUF types (Q6_0, IQ2_K ... IQ5_K, IQ2_KS, IQ3_KS, IQ4_KS, IQ5_KS, IQ4_KSS, IQ2_KL, the trellis
IQ1_KT ... IQ4_KT): random
blocks (every finite fp16 scale pattern) load losslessly, unpack() equal to ik's own C dequantization (the ik wheel's
libggml, dequantize_row_<type>, bit for bit); the layer against reference.py and float64; mixed types; a non-finite
scale or a truncated tensor is a ValueError naming the tensor. gguf-py cannot write these types: the files are
written with I8 tensors of the same bytes, then retyped."""
import ctypes
import struct

import gguf
import numpy as np
import pytest

from moe_cpu.loaders import load_layer
from test_gguf_quants import check_layer, ggml_c
from test_loaders import L, assert_load_raises, gguf_meta, write_gguf

# type -> (ik type id, elements per block, bytes per block, row scale: None / "f16" / "f32", fp16 d offsets in a
# block, group of the int form)
IK = {
    "Q6_0": (133, 32, 26, None, [0], 32), "IQ2_K": (137, 256, 76, None, [0], 16),
    "IQ3_K": (138, 256, 110, None, [0], 16), "IQ4_K": (139, 256, 144, None, [0], 16),
    "IQ5_K": (140, 256, 176, None, [0], 16), "IQ4_KS": (144, 256, 136, "f32", [], 32),
    "IQ2_KS": (145, 256, 70, "f16", [], 32), "IQ4_KSS": (146, 256, 128, "f32", [], 32),
    "IQ5_KS": (152, 256, 168, "f32", [], 32), "IQ3_KS": (156, 256, 102, "f16", [], 32),
    "IQ2_KL": (157, 256, 86, "f16", [], 32), "IQ2_KT": (153, 256, 68, "f32", [], 32),
    "IQ3_KT": (154, 256, 100, "f32", [], 32), "IQ4_KT": (155, 256, 128, "f32", [], 32),
    "IQ1_KT": (158, 256, 56, "f32", [], 32),
}
TYPES = sorted(IK)
CODEBOOK_TYPES = ("IQ2_K", "IQ3_K", "IQ2_KS", "IQ3_KS", "IQ2_KL")   # 16 values or fewer in all: int4 codes through them


def row_bytes(typ, K):
    _, blk, size, head, _, _ = IK[typ]
    return {None: 0, "f16": 2, "f32": 4}[head] + K // blk * size


def fp16(rng, shape, full_range, K):
    """fp16 scales: about unit layer outputs, or (full_range) every finite fp16 bit pattern."""
    if full_range:
        bits = rng.integers(0, 1 << 16, shape).astype(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF
        return bits.view(np.float16)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return (sign * rng.uniform(0.5, 1.5, shape) / (40 * 100 * np.sqrt(K))).astype(np.float16)


def raw_rows(rng, typ, shape, full_range=False):
    """Random rows of ``typ`` (uint8 [..., row bytes]) for a tensor of ``shape`` (K last)."""
    _, blk, size, head, d_offs, _ = IK[typ]
    lead, K = shape[:-1], shape[-1]
    b = rng.integers(0, 256, (*lead, K // blk, size), dtype=np.uint8)
    for off in d_offs:
        b[..., off:off + 2] = fp16(rng, b.shape[:-1], full_range, K)[..., None].view(np.uint8)
    b = b.reshape(*lead, -1)
    if head == "f16":
        h = fp16(rng, (*lead, 1), full_range, K).view(np.uint8)
    elif head == "f32":   # full range: every exponent up to 2^100 (times 127 * 127 stays finite)
        e = rng.integers(-126, 100, (*lead, 1)) if full_range else -np.log2(40 * 100 * np.sqrt(K)).astype(int)
        h = (rng.uniform(-2, 2, (*lead, 1)) * 2.0 ** e).astype(np.float32).view(np.uint8)
    else:
        return b
    return np.concatenate([h, b], axis=-1)


def ik_dequant(typ, raw, K):
    """ik's dequantize_row_<typ> (its libggml) of rows raw [..., row bytes] -> float32 [..., K], one row a call."""
    fn = getattr(ggml_c(), "dequantize_row_" + typ.lower())
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    r = np.ascontiguousarray(raw).reshape(-1, raw.shape[-1])
    y = np.empty((r.shape[0], K), np.float32)
    for i in range(r.shape[0]):
        fn(r[i].ctypes.data, y[i].ctypes.data, K)
    return y.reshape(*raw.shape[:-1], K)


def retype(path, name, tid, K):
    """Tensor ``name`` of the GGUF at path (written as I8 rows of its bytes): type id ``tid``, ne[0] = K."""
    data = bytearray(path.read_bytes())
    key = name.encode()
    at = data.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)   # tensor info: name, n_dims, ne[], type, offset
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<Q", data, at + 4, K)
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, tid)
    path.write_bytes(bytes(data))


def ik_file(tmp_path, rng, types, E=4, H=256, I=256, full_range=False, layers=3):
    """A qwen3moe GGUF whose expert tensors are ik types: (path, raw rows and ik's dequantized values of layer L)."""
    tensors, retyped, raw, keep = {}, [], {}, {}
    for layer in range(layers):
        p = f"blk.{layer}."
        tensors[p + "ffn_gate_inp.weight"] = (rng.standard_normal((E, H)).astype(np.float32), None)
        for name, typ, shape in (("ffn_gate_exps.weight", types[0], (E, I, H)),
                                 ("ffn_up_exps.weight", types[1], (E, I, H)),
                                 ("ffn_down_exps.weight", types[2], (E, H, I))):
            r = raw_rows(rng, typ, shape, full_range)
            tensors[p + name] = (r.view(np.int8), gguf.GGMLQuantizationType.I8)
            retyped.append((p + name, IK[typ][0], shape[-1]))
            if layer == L:
                raw[name], keep[name] = r, ik_dequant(typ, r, shape[-1])
    path = write_gguf(tmp_path / "ik.gguf", "qwen3moe", gguf_meta("qwen3moe", E, H, I), tensors)
    for args in retyped:
        retype(path, *args)
    return path, raw, keep


@pytest.mark.isa
@pytest.mark.parametrize("typ", TYPES)
def test_ik_unpack_equals_ik_dequantize_bit_for_bit(tmp_path, rng, typ):
    """Every finite fp16 scale pattern (float32 row scales over 2^-126 .. 2^100): unpack() equals ik's C."""
    path, _, keep = ik_file(tmp_path, rng, (typ,) * 3, E=2, H=256, I=512, full_range=True)
    lw = load_layer(path, L)
    for packed, names in ((lw.w13, ("ffn_gate_exps.weight", "ffn_up_exps.weight")), (lw.w2, ("ffn_down_exps.weight",))):
        want = np.concatenate([keep[n] for n in names], axis=1)
        got = packed.unpack()
        same = got.view(np.uint32) == want.view(np.uint32)
        if typ == "IQ3_KT":   # ik negates the float: -0.0 where a zero value meets a sign bit, an int8 0 here
            same |= (got == 0) & (want == 0)
        assert same.all(), f"{typ}: {np.count_nonzero(~same)} values differ, first at {np.argwhere(~same)[0]}"


@pytest.mark.isa
@pytest.mark.parametrize("M", [0, 1, 3, 257])
@pytest.mark.parametrize("typ", TYPES)
def test_ik_layer_of_one_type(tmp_path, rng, typ, M):
    path, _, keep = ik_file(tmp_path, rng, (typ,) * 3)
    lw = load_layer(path, L)
    scheme, form = ("int4_w4a8", "int4+codebook") if typ in CODEBOOK_TYPES else ("int8_w8a8", "int8")
    assert lw.w13.scheme == lw.w2.scheme == scheme and lw.w13.form == lw.w2.form == form
    assert lw.w13.group_size == lw.w2.group_size == IK[typ][5] and lw.w13.act_block == lw.w2.act_block == 32
    assert typ in lw.source and f"{form}/{form}" in lw.source
    check_layer(rng, lw, keep, M)


@pytest.mark.parametrize("types", [("IQ2_KS", "IQ2_KS", "IQ3_KS"), ("IQ4_K", "IQ4_KS", "Q6_0"),
                                   ("IQ2_K", "IQ3_K", "IQ5_KS"), ("IQ4_KSS", "IQ2_KL", "IQ5_K")])
def test_ik_mixed_types(tmp_path, rng, types):
    """Gate / up / down in different ik types (groups of 16 and 32 meet as int8 in w13's finer group)."""
    path, _, keep = ik_file(tmp_path, rng, types)
    check_layer(rng, load_layer(path, L), keep, 5)


@pytest.mark.parametrize("typ,at,what", [("IQ4_K", 0, "non-finite d"), ("Q6_0", 0, "non-finite d"),
                                         ("IQ2_KS", -1, "non-finite row scale"), ("IQ4_KS", -1, "non-finite row scale")])
def test_ik_non_finite_scales_raise_value_error(tmp_path, rng, typ, at, what):
    """An fp16 d (or the row scale, at = -1) set to inf in row 3 of the layer's down tensor: a ValueError naming the
    tensor and row."""
    path, raw, _ = ik_file(tmp_path, rng, (typ,) * 3)
    data = bytearray(path.read_bytes())
    r = raw["ffn_down_exps.weight"]
    pos = bytes(data).find(r.tobytes()[:4096])   # the tensor's data in the file
    assert pos > 0
    row = pos + 3 * r.shape[-1]
    if at < 0:
        inf = np.array([np.inf], np.float16 if IK[typ][3] == "f16" else np.float32).view(np.uint8).tobytes()
        data[row:row + len(inf)] = inf
    else:
        data[row + at:row + at + 2] = np.array([np.inf], np.float16).view(np.uint8).tobytes()
    path.write_bytes(bytes(data))
    assert_load_raises(tmp_path, path, None, typ, [f"blk.{L}.ffn_down_exps.weight", what, "row 3"])


def test_ik_truncated_tensor_raises_value_error(tmp_path, rng):
    """ne[0] one block short of the bytes of its rows (a mislabelled shape): the byte count check names it."""
    path, _, _ = ik_file(tmp_path, rng, ("IQ4_KS",) * 3)
    retype(path, f"blk.{L}.ffn_down_exps.weight", IK["IQ4_KS"][0], 512)
    assert_load_raises(tmp_path, path, None, "ne", [f"blk.{L}.ffn_down_exps.weight"])
