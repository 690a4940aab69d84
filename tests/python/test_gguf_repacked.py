"""ik_llama.cpp's row-interleaved types (Q4_0_R8 ... Q6_K_R4, IQ4_XS_R8, IQ2_K_R4 ... IQ5_KS_R4), quantized by ik's own C code
(the ik wheel's libggml, quantize_<type>): the loader rebuilds exactly the blocks ik's base quantizer writes for the
same floats, unpack() equals ik's dequantize_row_<type> bit for bit, and a layer gives the same bits as the base-type
file; a tensor whose rows are not whole groups is a ValueError naming it."""
import ctypes

import gguf
import numpy as np
import pytest

import moe_cpu
from moe_cpu.loaders import load_layer
from moe_cpu.loaders.gguf_repacked import REPACKED, base_rows
from test_gguf_ik import retype
from test_gguf_quants import ggml_c
from test_loaders import L, assert_load_raises, gguf_meta, write_gguf

# type -> (elements, bytes) of the base type's block
BASE = {"Q4_0": (32, 18), "Q5_0": (32, 22), "Q6_0": (32, 26), "Q8_0": (32, 34), "IQ4_NL": (32, 18), "Q4_K": (256, 144),
        "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ4_XS": (256, 136), "IQ2_K": (256, 76), "IQ3_K": (256, 110),
        "IQ4_K": (256, 144), "IQ5_K": (256, 176), "IQ4_KS": (256, 136), "IQ5_KS": (256, 168), "Q2_K": (256, 84),
        "Q3_K": (256, 110), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74), "IQ2_S": (256, 82), "IQ3_XXS": (256, 98),
        "IQ3_S": (256, 110)}
HEAD = {"IQ4_KS": 4, "IQ5_KS": 4}   # a float32 row scale first
GRIDS = {"IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ3_S": 21, "IQ2_S": 22}   # ggml's type ids
IK_IDS = {"Q6_0": 133, "IQ2_K": 137, "IQ3_K": 138, "IQ4_K": 139, "IQ5_K": 140, "IQ4_KS": 144, "IQ5_KS": 152}


def c_name(typ):
    """ggml's spelling in function names: q4_K, iq2_k, q4_0_r8."""
    return typ[:-1].lower() + "K" if typ in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K") else typ.lower()
TYPES = sorted(REPACKED)


def ik_quantize(typ, x):
    """ik's quantize_<typ> of float32 rows x [rows, K] -> uint8 [rows, row bytes]."""
    fn = getattr(ggml_c(), "quantize_" + c_name(typ))
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_size_t
    x = np.ascontiguousarray(x, np.float32)
    base = REPACKED[typ][1] if typ in REPACKED else typ
    blk, size = BASE[base]
    out = np.zeros((x.shape[0], HEAD.get(base, 0) + x.shape[1] // blk * size), np.uint8)
    imatrix = None
    if base in GRIDS:   # their grids are built on first use, and llama-quantize gives them an importance matrix
        ggml_c().ggml_quantize_init(ctypes.c_int(GRIDS[base]))
        imatrix = np.ones(x.shape[1], np.float32)
    assert fn(x.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1],
              None if imatrix is None else imatrix.ctypes.data) == out.nbytes
    return out


def ik_dequant(typ, raw, K):
    """ik's dequantize_row_<typ> of rows [rows, row bytes], R rows a call (repacked types) -> float32 [rows, K]."""
    R = REPACKED[typ][2] if typ in REPACKED else 1
    fn = getattr(ggml_c(), "dequantize_row_" + c_name(typ))
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    r = np.ascontiguousarray(raw).reshape(-1, R * raw.shape[-1])
    y = np.empty((r.shape[0], R * K), np.float32)
    for i in range(r.shape[0]):
        fn(r[i].ctypes.data, y[i].ctypes.data, R * K)
    return y.reshape(-1, K)


def weights(rng, E, N, K):
    return (rng.standard_normal((E, N, K)) / np.sqrt(K)).astype(np.float32)


def moe_file(path, rng, typ, E=2, H=256, I=256, seed_w=None):
    """A qwen3moe GGUF whose expert tensors are ``typ`` (ik-quantized from fixed floats): (path, raw rows of layer L)."""
    w = seed_w or {n: weights(np.random.default_rng(i), E, *s)
                   for i, (n, s) in enumerate((("ffn_gate_exps.weight", (I, H)), ("ffn_up_exps.weight", (I, H)),
                                               ("ffn_down_exps.weight", (H, I))))}
    tensors, retyped, raw = {}, [], {}
    for layer in range(3):
        p = f"blk.{layer}."
        tensors[p + "ffn_gate_inp.weight"] = (np.random.default_rng(9).standard_normal((E, H)).astype(np.float32), None)
        for name, x in w.items():
            r = ik_quantize(typ, x.reshape(-1, x.shape[-1])).reshape(*x.shape[:2], -1)
            tid = REPACKED[typ][0] if typ in REPACKED else IK_IDS.get(typ)   # types gguf-py does not know
            if tid:
                tensors[p + name] = (r.view(np.int8), gguf.GGMLQuantizationType.I8)
                retyped.append((p + name, tid, x.shape[-1]))
            else:
                tensors[p + name] = (r, gguf.GGMLQuantizationType[typ])
            if layer == L:
                raw[name] = r
    path = write_gguf(path, "qwen3moe", gguf_meta("qwen3moe", E, H, I), tensors)
    for args in retyped:
        retype(path, *args)
    return path, raw, w


@pytest.mark.parametrize("typ", TYPES)
def test_repacked_rows_rebuild_ik_base_blocks(rng, typ):
    """base_rows() of ik's repacked bytes equals ik's base quantization of the same floats, byte for byte."""
    base, R = REPACKED[typ][1], REPACKED[typ][2]
    blk, size = BASE[base]
    x = weights(rng, 1, 2 * R, 512)[0]
    got = base_rows(typ, ik_quantize(typ, x), x.shape[0], 512 // blk, size)
    assert np.array_equal(got, ik_quantize(base, x))


@pytest.mark.parametrize("typ", TYPES)   # not per ISA level: the rebuilt blocks are the base type's, whose kernels
def test_repacked_unpack_equals_ik_dequantize_and_layer_equals_base(tmp_path, rng, typ):
    """unpack() equals ik's dequantize_row_<base> of ik's base quantization of the same floats, bit for bit, and
    ik's dequantize_row_<typ> of the repacked rows (bit for bit, but Q5_0_R4 / Q6_0_R4, where ik's repacked
    dequantizer computes d * q - 16 d / - 32 d, not the base type's d * (q - 16): within one rounding); the layer's
    output equals the base-type file's."""
    path, raw, w = moe_file(tmp_path / "r.gguf", rng, typ)
    base = REPACKED[typ][1]
    lw = load_layer(path, L)
    for packed, names in ((lw.w13, ("ffn_gate_exps.weight", "ffn_up_exps.weight")), (lw.w2, ("ffn_down_exps.weight",))):
        got = packed.unpack()
        K = w[names[0]].shape[-1]
        want = np.concatenate([ik_dequant(base, ik_quantize(base, w[n].reshape(-1, K)), K).reshape(w[n].shape)
                               for n in names], axis=1)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), typ
        want_r = np.concatenate([ik_dequant(typ, raw[n].reshape(-1, raw[n].shape[-1]), K).reshape(w[n].shape)
                                 for n in names], axis=1)
        if typ in ("Q5_0_R4", "Q6_0_R4"):
            np.testing.assert_allclose(got, want_r, rtol=0, atol=float(np.abs(got).max()) * 2.0 ** -22)
        else:
            assert np.array_equal(got.view(np.uint32), want_r.view(np.uint32)), typ
    base_path, _, _ = moe_file(tmp_path / "b.gguf", rng, REPACKED[typ][1], seed_w=w)
    layer, base_layer = moe_cpu.MoELayer.from_pretrained(path, layer_idx=L), moe_cpu.MoELayer.from_pretrained(base_path, layer_idx=L)
    for M in (1, 5):
        x = rng.standard_normal((M, 256)).astype(np.float32)
        assert np.array_equal(layer(x), base_layer(x)), (typ, M)


@pytest.mark.parametrize("typ", ["Q4_0_R8", "Q4_K_R4"])
def test_repacked_rows_not_whole_groups_raise(tmp_path, rng, typ):
    """Matrices whose row count is not a multiple of R: a ValueError naming the tensor."""
    R = REPACKED[typ][2]
    base = REPACKED[typ][1]
    E, H, I = 2, 256, 256 + 2   # gate / up: I rows, not whole groups of R
    tensors = {}
    for layer in range(3):
        p = f"blk.{layer}."
        tensors[p + "ffn_gate_inp.weight"] = (rng.standard_normal((E, H)).astype(np.float32), None)
        for name, shape in (("ffn_gate_exps.weight", (E, I, H)), ("ffn_up_exps.weight", (E, I, H))):
            r = ik_quantize(base, weights(rng, *shape).reshape(-1, H)).reshape(E, I, -1)
            tensors[p + name] = (r.view(np.int8), gguf.GGMLQuantizationType.I8)
        tensors[p + "ffn_down_exps.weight"] = (weights(rng, E, H, I), None)
    path = write_gguf(tmp_path / "bad.gguf", "qwen3moe", gguf_meta("qwen3moe", E, H, I), tensors)
    for layer in range(3):
        for name in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
            retype(path, f"blk.{layer}.{name}", REPACKED[typ][0], H)
    assert_load_raises(tmp_path, path, None, typ, [f"blk.{L}.ffn_gate_exps.weight", f"{typ} interleaves groups of {R} rows"])
