"""GGUF quantized types as llama.cpp users hold them (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL,
IQ4_XS, MXFP4, beside Q4_0 / Q8_0, and the low-bit Q2_K, Q3_K, TQ1_0, TQ2_0, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S): random valid blocks written with gguf.GGUFWriter load losslessly
(unpack() equals gguf.quants.dequantize bit for bit) and fused_experts matches the reference on
them; mixed types in one layer, shared experts; bad files raise a clear ValueError in a subprocess."""
import ctypes
import os
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest

import moe_cpu
from conftest import SPLIT_CODE_KERNELS, TOL, assert_close, make_input, make_routing, ref
from moe_cpu.loaders import load_layer
from test_loaders import L, assert_load_raises, gguf_meta, write_gguf

T = gguf.GGMLQuantizationType
# type -> (elements per block, bytes per block, [(offset, kind)] of its scale fields, |value| size)
# kind "d": an fp16 scale, "m": an fp16 offset, "e": MXFP4's e8m0 exponent byte, "d4": IQ1_M's fp16 d, a nibble in
# the top of each of 4 u16 words.
LAYOUT = {
    "Q4_0": (32, 18, [(0, "d")], 4), "Q4_1": (32, 20, [(0, "d"), (2, "m")], 8),
    "Q5_0": (32, 22, [(0, "d")], 8), "Q5_1": (32, 24, [(0, "d"), (2, "m")], 16),
    "Q8_0": (32, 34, [(0, "d")], 64), "Q4_K": (256, 144, [(0, "d"), (2, "m")], 250),
    "Q5_K": (256, 176, [(0, "d"), (2, "m")], 500), "Q6_K": (256, 210, [(208, "d")], 1000),
    "IQ4_NL": (32, 18, [(0, "d")], 60), "IQ4_XS": (256, 136, [(0, "d")], 1000), "MXFP4": (32, 17, [(0, "e")], 5),
    "Q2_K": (256, 84, [(80, "d"), (82, "m")], 30), "Q3_K": (256, 110, [(108, "d")], 60),
    "TQ1_0": (256, 54, [(52, "d")], 1), "TQ2_0": (256, 66, [(64, "d")], 1),
    "IQ1_S": (256, 50, [(0, "d")], 8), "IQ1_M": (256, 56, [(48, "d4")], 8),
    "IQ2_XXS": (256, 66, [(0, "d")], 100), "IQ2_XS": (256, 74, [(0, "d")], 100), "IQ2_S": (256, 82, [(0, "d")], 100),
    "IQ3_XXS": (256, 98, [(0, "d")], 250), "IQ3_S": (256, 110, [(0, "d")], 250),
}
TYPES = sorted(LAYOUT)


def raw_blocks(rng, typ, shape, full_range=False):
    """Random bytes as blocks of ``typ`` for a tensor of ``shape`` (K last), its fp16 fields set to
    finite values: about unit outputs, or (full_range) any finite fp16 and any e8m0 byte."""
    blk, size, fields, mag = LAYOUT[typ]
    lead, K = shape[:-1], shape[-1]
    b = rng.integers(0, 256, (*lead, K // blk, size), dtype=np.uint8)
    for off, kind in fields:
        if kind == "e":
            e = rng.integers(0, 256, b.shape[:-1]) if full_range else 127 - int(np.log2(np.sqrt(K))) + rng.integers(-2, 1, b.shape[:-1])
            b[..., off] = e.astype(np.uint8)
            continue
        if full_range:   # every finite fp16 bit pattern (subnormals, negatives, the largest)
            bits = rng.integers(0, 1 << 16, b.shape[:-1]).astype(np.uint16)
            bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF
            v = bits.view(np.float16)
        else:
            sign = np.where(rng.random(b.shape[:-1]) < 0.5, -1.0, 1.0)
            v = (sign * rng.uniform(0.5, 1.5, b.shape[:-1]) / (mag * np.sqrt(K))).astype(np.float16)
        if kind == "d4":
            w = np.ascontiguousarray(b[..., off:off + 8]).view(np.uint16) & np.uint16(0x0FFF)
            for i in range(4):
                w[..., i] |= ((v.view(np.uint16) >> np.uint16(4 * i)) & np.uint16(15)) << np.uint16(12)
            b[..., off:off + 8] = w.view(np.uint8)
            continue
        b[..., off:off + 2] = v[..., None].view(np.uint8)
    return b.reshape(*lead, -1)


def dequant(raw, typ, shape):
    return gguf.quants.dequantize(raw, T[typ]).reshape(shape)


def moe_file(tmp_path, rng, types, E=4, H=256, I=256, shexp=None):
    """A 3-layer qwen3moe GGUF: layer L's gate/up/down (and shared gate/up/down) in ``types``."""
    tensors, keep = {}, {}
    for layer in range(3):
        p = f"blk.{layer}."
        tensors[p + "ffn_gate_inp.weight"] = (rng.standard_normal((E, H)).astype(np.float32), None)
        specs = [("ffn_gate_exps.weight", types[0], (E, I, H)), ("ffn_up_exps.weight", types[1], (E, I, H)),
                 ("ffn_down_exps.weight", types[2], (E, H, I))]
        if shexp:
            specs += [("ffn_gate_shexp.weight", types[0], (shexp, H)), ("ffn_up_shexp.weight", types[1], (shexp, H)),
                      ("ffn_down_shexp.weight", types[2], (H, shexp))]
        for name, typ, shape in specs:
            raw = raw_blocks(rng, typ, shape)
            tensors[p + name] = (raw, T[typ])
            if layer == L:
                keep[name] = dequant(raw, typ, shape)
    return write_gguf(tmp_path / "m.gguf", "qwen3moe", gguf_meta("qwen3moe", E, H, I), tensors), keep


def ref_of(p):
    """RefWeights from a PackedExperts' stored codes (their decoding is checked bit for bit first)."""
    d = p.unpack_quantized()
    if p.scheme.startswith("int4"):
        return ref.RefWeights.int4(d["qweight"], d["scales"], p.group_size, d["zeros"], d["codebook"], d["mins"],
                                   scheme=p.scheme, act_block=p.act_block)
    return ref.RefWeights.int8(d["qweight"], d["scales"], p.group_size, d["mins"], scheme=p.scheme, act_block=p.act_block)


def check_layer(rng, lw, keep, M, k=2):
    """Bit-exact weights, then fused_experts against (1) the quantized-path reference on the same
    codes, (2) float64 on gguf's dequantized weights (activation quantization error only)."""
    w13 = np.concatenate([keep["ffn_gate_exps.weight"], keep["ffn_up_exps.weight"]], axis=1)
    np.testing.assert_array_equal(lw.w13.unpack(), w13)
    np.testing.assert_array_equal(lw.w2.unpack(), keep["ffn_down_exps.weight"])
    E, H = lw.w13.num_experts, lw.w13.in_features
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    got = moe_cpu.fused_experts(x, lw.w13, lw.w2, tw, ids)
    a16 = lw.w13.scheme in moe_cpu.A16_SCHEMES
    tol = "int4_w4a16" if a16 else "int4_w4a8"
    assert_close(got, ref.fused_experts_ref(x, ref_of(lw.w13), ref_of(lw.w2), tw, ids), tol, "vs reference.py")
    if M:
        want = ref.fused_experts_float64(x, w13, keep["ffn_down_exps.weight"], tw, ids)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < TOL[tol] * 2, f"vs float64 on gguf's dequantized weights: {err:.3g}"


def check_unpack_bits(tmp_path, rng, typ, dequant):
    """A layer of random ``typ`` blocks with every finite fp16 scale pattern (and every e8m0 byte): unpack() equals
    dequant(raw blocks [E, N, bytes]) -> float32 [E, N, K] bit for bit."""
    E, H, I = 2, 256, 512
    tensors = {}
    for layer in range(3):
        tensors[f"blk.{layer}.ffn_gate_inp.weight"] = (np.zeros((E, H), np.float32), None)
        for name, shape in (("gate", (E, I, H)), ("up", (E, I, H)), ("down", (E, H, I))):
            tensors[f"blk.{layer}.ffn_{name}_exps.weight"] = (raw_blocks(rng, typ, shape, full_range=True), T[typ])
    lw = load_layer(write_gguf(tmp_path / "f.gguf", "qwen3moe", gguf_meta("qwen3moe", E, H, I), tensors), L)
    for packed, names in ((lw.w13, ("gate", "up")), (lw.w2, ("down",))):
        with np.errstate(over="ignore"):   # MXFP4 e = 255 (2^127) times 12 is inf, in both
            want = np.concatenate([dequant(tensors[f"blk.{L}.ffn_{n}_exps.weight"][0]) for n in names], axis=1)
        got = packed.unpack()
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{typ}: {np.count_nonzero(~same)} values differ, first at {np.argwhere(~same)[0]}"


@pytest.mark.isa
@pytest.mark.parametrize("typ", TYPES)
def test_unpack_equals_gguf_dequantize_bit_for_bit(tmp_path, rng, typ):
    """Every finite fp16 scale pattern (and every e8m0 byte) through our decoding and unpack()."""
    check_unpack_bits(tmp_path, rng, typ, lambda raw: gguf.quants.dequantize(raw, T[typ]))


# ggml's C dequantization, the second oracle of the low-bit types (their grids are gguf-py's tables in the loader):
# ik_llama.cpp's libggml, which scripts/setup.sh installs in build/ik_oracle (or the bench's peer in /tmp/ikpeer).
# ik's build has no TQ1_0 / TQ2_0 (checked against gguf-py above only).
GGML_C = ("Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ggml_c():
    for d in (os.path.join(ROOT, "build", "ik_oracle"), "/tmp/ikpeer"):
        lib = os.path.join(d, "ik_llama_cpp", "lib", "libggml.so")
        if os.path.isfile(lib):
            c = ctypes.CDLL(lib)

            class Params(ctypes.Structure):   # ggml_init_params
                _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

            c.ggml_init.argtypes, c.ggml_init.restype = [Params], ctypes.c_void_p
            c.ggml_free.argtypes = [ctypes.c_void_p]
            c.ggml_free(c.ggml_init(Params(1 << 16, None, False)))   # fills ggml's fp16 table, which decoding reads
            return c
    pytest.skip("no libggml: bash scripts/setup.sh installs it in build/ik_oracle")


@pytest.mark.parametrize("typ", GGML_C)
def test_low_bit_unpack_equals_ggml_c_dequantize(tmp_path, rng, typ):
    """The low-bit types against ggml's C code (dequantize_row_<type>, its own grids and sign tables), bit for bit,
    with every finite fp16 scale pattern."""
    fn = getattr(ggml_c(), "dequantize_row_" + typ.lower().replace("_k", "_K"))
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None

    def dequant(raw):
        raw = np.ascontiguousarray(raw)
        y = np.empty(raw.size // LAYOUT[typ][1] * LAYOUT[typ][0], np.float32)
        fn(raw.ctypes.data, y.ctypes.data, y.size)
        return y.reshape(*raw.shape[:-1], -1)

    check_unpack_bits(tmp_path, rng, typ, dequant)


# TQ1_0 / TQ2_0: int8 g32 where the int8 kernel takes 2-bit split codes, else int4 g256
TQ_SPLIT = moe_cpu.cpu_features()["kernels"]["int8_w8a8"].startswith(SPLIT_CODE_KERNELS)
TQ_FORM = "int8" if TQ_SPLIT else "int4"
FORM = {"Q4_0": "int4", "Q4_1": "int4+codebook+mins", "Q5_0": "int8", "Q5_1": "int8+mins", "Q8_0": "int8",
        "Q4_K": "int4+codebook+mins", "Q5_K": "int8+mins", "Q6_K": "int8", "IQ4_NL": "int4+codebook",
        "IQ4_XS": "int4+codebook", "MXFP4": "int4+codebook",
        "Q2_K": "int8+mins", "Q3_K": "int8", "TQ1_0": TQ_FORM, "TQ2_0": TQ_FORM, "IQ1_S": "int4+codebook",
        "IQ1_M": "int4+codebook", "IQ2_XXS": "int4+codebook", "IQ2_XS": "int4+codebook", "IQ2_S": "int4+codebook",
        "IQ3_XXS": "int4+codebook",
        "IQ3_S": "int4+codebook"}
# The group of each form: the file's scale blocks (16, 32, or TQ's 256; as int8, 8 groups of 32 with its d).
GROUP = {t: 32 for t in FORM} | {t: 16 for t in ("Q6_K", "Q2_K", "Q3_K", "IQ1_M", "IQ2_XS", "IQ2_S")} | \
    {"TQ1_0": 32 if TQ_SPLIT else 256, "TQ2_0": 32 if TQ_SPLIT else 256}


# ggml's vec-dot blocks are 32 (Q8_0 / Q8_1) or 256 (Q8_K for the K-quants and the IQ types); a GGUF layer runs
# ggml's block or a finer one: 32, or 128 for the K-quants (docs/numerics.md "Activation blocks")
GGUF_ACT_BLOCK = {t: 32 for t in FORM} | {t: 128 for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")}  # the K-quants


@pytest.mark.isa
@pytest.mark.parametrize("M", [0, 1, 3, 257])
@pytest.mark.parametrize("typ", TYPES)
def test_layer_of_one_type(tmp_path, rng, typ, M):
    path, keep = moe_file(tmp_path, rng, (typ,) * 3)
    lw = load_layer(path, L)      # GGUF keeps int8 activations by default, in ggml's blocks, as llama.cpp computes them
    assert lw.w13.form == lw.w2.form == FORM[typ] and lw.scheme in moe_cpu.A8_SCHEMES
    assert lw.w13.act_block == lw.w2.act_block == GGUF_ACT_BLOCK[typ]
    assert lw.w2.group_size == GROUP[typ]
    check_layer(rng, lw, keep, M)
    if M in (1, 257):             # 16-bit activations are one argument away, on every form
        a16 = lw.scheme[:-1] + "16"
        if a16 == "int4_w4a16" and GROUP[typ] == 16:   # int4 A16 takes groups of 32: a clear error, or int8
            with pytest.raises(ValueError, match="int4_w4a16' takes int4 groups of 32 or more.*groups of 16"):
                load_layer(path, L, scheme=a16)
            a16 = "int8_w8a16"
        lw16 = load_layer(path, L, scheme=a16)
        assert lw16.scheme == lw16.w2.scheme == a16
        assert lw16.w13.form == (FORM[typ] if a16.startswith(lw.scheme[:4]) else FORM[typ].replace("int4+codebook", "int8"))
        assert lw16.w13.act_block is None
        check_layer(rng, lw16, keep, M)
    if M == 3:                    # per token, or another block, on request
        for block in (None, 64, 256):   # per token, any other block, ggml's Q8_K
            lwb = load_layer(path, L, act_block=block)
            assert lwb.w13.act_block == lwb.w2.act_block == block
            check_layer(rng, lwb, keep, M)


@pytest.mark.isa
@pytest.mark.parametrize("types,forms", [
    (("Q4_K", "Q4_K", "Q6_K"), ("int4+codebook+mins", "int8")),        # Q4_K_M's usual layer
    (("Q4_K", "Q4_K", "Q5_K"), ("int4+codebook+mins", "int8+mins")),
    (("Q4_K", "Q6_K", "IQ4_XS"), ("int8+mins", "int4+codebook")),      # gate and up differ: w13 widens to int8 g16
    (("IQ4_XS", "IQ4_NL", "MXFP4"), ("int4+codebook", "int4+codebook")),
    (("MXFP4", "IQ4_NL", "Q8_0"), ("int8", "int8")),                   # two codebooks: int8 values
    (("Q2_K", "Q2_K", "Q3_K"), ("int8+mins", "int8")),                 # the dynamic quants' Q2_K experts, down a step up
    (("IQ2_XXS", "IQ2_XXS", "IQ3_XXS"), ("int4+codebook", "int4+codebook")),   # a codebook each
    (("IQ1_S", "IQ1_M", "IQ2_XS"), ("int4+codebook", "int4+codebook")),  # one codebook, groups of 32 and 16: int4 g16
    (("IQ2_XXS", "IQ2_S", "IQ1_M"), ("int4+codebook", "int4+codebook")),
    (("TQ1_0", "TQ2_0", "IQ3_S"), (TQ_FORM, "int4+codebook")),
])
def test_mixed_types_in_one_layer(tmp_path, rng, types, forms):
    path, keep = moe_file(tmp_path, rng, types)
    lw = load_layer(path, L)
    assert (lw.w13.form, lw.w2.form) == forms
    check_layer(rng, lw, keep, 33)
    layer = moe_cpu.MoELayer.from_pretrained(path, L)
    assert lw.w13.form in repr(layer) or "int8" in repr(layer)


@pytest.mark.isa
@pytest.mark.parametrize("E,k,H,I", [(1, 1, 96, 160), (3, 3, 64, 96)])
def test_one_expert_k_equal_e_and_odd_shapes(tmp_path, rng, E, k, H, I):
    path, keep = moe_file(tmp_path, rng, ("IQ4_NL", "IQ4_NL", "Q5_1"), E=E, H=H, I=I)
    check_layer(rng, load_layer(path, L), keep, 7, k=k)


@pytest.mark.isa
@pytest.mark.parametrize("types", [("Q4_K", "Q4_K", "Q6_K"), ("MXFP4", "MXFP4", "MXFP4")])
def test_shared_expert_types(tmp_path, rng, types):
    Is = 256
    path, keep = moe_file(tmp_path, rng, types, shexp=Is)
    lw = load_layer(path, L)
    np.testing.assert_array_equal(lw.shared_w13.unpack()[0], np.concatenate(
        [keep["ffn_gate_shexp.weight"], keep["ffn_up_shexp.weight"]]))
    np.testing.assert_array_equal(lw.shared_w2.unpack()[0], keep["ffn_down_shexp.weight"])
    x = make_input(rng, 5, 256)
    f = np.zeros_like(x)
    got = moe_cpu.shared_expert(x, lw.shared_w13, lw.shared_w2, f)
    want = ref.shared_expert_ref(x, ref_of(lw.shared_w13), ref_of(lw.shared_w2), f)
    assert_close(got, want, "int4_w4a8", "shared expert")


def _bad_file(tmp_path, label):
    rng = np.random.default_rng(1)
    typ = "Q4_K"
    path, _ = moe_file(tmp_path, rng, (typ,) * 3, E=2)
    data = bytearray(path.read_bytes())
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == f"blk.{L}.ffn_down_exps.weight")
    off = int(t.data_offset)
    if label == "truncated_block":        # the file ends inside the last tensor's last block
        last = max(r.tensors, key=lambda t: t.data_offset)
        data = data[:int(last.data_offset) + int(last.n_bytes) - 7]
    elif label == "nan_d":
        data[off + 144 * 3:off + 144 * 3 + 2] = np.array([np.nan], np.float16).view(np.uint8).tobytes()
    elif label == "inf_dmin":
        data[off + 2:off + 4] = np.array([-np.inf], np.float16).view(np.uint8).tobytes()
    elif label == "row_not_whole_blocks":   # the header says rows of 250 elements: not whole 256-blocks
        name = t.name.encode()
        at = data.find(struct.pack("<Q", len(name)) + name) + 8 + len(name)   # tensor info: name, n_dims, ne[]
        assert struct.unpack_from("<I", data, at)[0] == 3
        struct.pack_into("<Q", data, at + 4, 250)
    path.write_bytes(bytes(data))
    return path


BAD = [("truncated_block", ["m.gguf"]),
       ("row_not_whole_blocks", ["m.gguf", "Q4_K", "256", "250"]),   # gguf-py's reader refuses the header
       ("nan_d", ["blk.1.ffn_down_exps.weight", "non-finite d", "nan"]),
       ("inf_dmin", ["blk.1.ffn_down_exps.weight", "non-finite dmin", "inf"])]


@pytest.mark.parametrize("label,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_files_raise_value_error(tmp_path, label, needles):
    assert_load_raises(tmp_path, _bad_file(tmp_path, label), None, label, needles)


# A non-finite scale field of a low-bit type: (type, byte offset of its fp16 in a block, name in the error).
LOWBIT_BAD = [("Q2_K", 82, "dmin"), ("Q3_K", 108, "d"), ("TQ1_0", 52, "d"), ("IQ2_XXS", 0, "d"), ("IQ1_M", -1, "d")]


@pytest.mark.parametrize("typ,off,what", LOWBIT_BAD, ids=[b[0] for b in LOWBIT_BAD])
def test_low_bit_non_finite_scales_raise_value_error(tmp_path, rng, typ, off, what):
    """A NaN / inf d or dmin in one block of the layer's down tensor: a ValueError naming the tensor and the field."""
    path, _ = moe_file(tmp_path, rng, (typ,) * 3, E=2)
    data = bytearray(path.read_bytes())
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == f"blk.{L}.ffn_down_exps.weight")
    at = int(t.data_offset) + LAYOUT[typ][1] * 3          # the fourth block: row 3 (rows of I = 256, one block)
    if off < 0:   # IQ1_M: d's fp16 in the top nibbles of the last 4 u16 words; 0x7e00 is NaN
        w = np.frombuffer(bytes(data[at + 48:at + 56]), np.uint16) & 0x0FFF
        w = w | (np.array([0xE, 0x0, 0xE, 0x7], np.uint16) << 12)
        data[at + 48:at + 56] = w.astype("<u2").tobytes()
    else:
        data[at + off:at + off + 2] = np.array([np.inf], np.float16).view(np.uint8).tobytes()
    path.write_bytes(bytes(data))
    assert_load_raises(tmp_path, path, None, typ, [f"blk.{L}.ffn_down_exps.weight", f"non-finite {what}", "row 3"])


@pytest.mark.slow
@pytest.mark.parametrize("types", [("Q4_K", "Q4_K", "Q6_K"), ("IQ4_XS", "IQ4_XS", "IQ4_XS"), ("MXFP4",) * 3])
def test_cli_convert_then_run(tmp_path, rng, types):
    """`moe-cpu convert` packs the file's forms into version 2 files that load back unchanged, and
    `moe-cpu run` runs both the GGUF file and the converted layer."""
    path, keep = moe_file(tmp_path, rng, types)
    out = tmp_path / "converted"
    cli = lambda *a: subprocess.run([sys.executable, "-m", "moe_cpu", *map(str, a)], capture_output=True,  # noqa: E731
                                    text=True, cwd=tmp_path, timeout=300)
    conv = cli("convert", "--checkpoint", path, "--out", out, "--layers", L)
    assert conv.returncode == 0, conv.stderr
    layer = moe_cpu.MoELayer.load(out / f"layer_{L:03d}")
    direct = load_layer(path, L)
    assert (layer.w13.form, layer.w2.form) == (direct.w13.form, direct.w2.form)
    want = (GGUF_ACT_BLOCK[types[0]], GGUF_ACT_BLOCK[types[2]])  # the GGUF default, kept by the packed files
    assert layer.act_blocks == (direct.w13.act_block, direct.w2.act_block) == want
    np.testing.assert_array_equal(layer.w2.unpack(), keep["ffn_down_exps.weight"])
    per_token = cli("convert", "--checkpoint", path, "--out", tmp_path / "per_token", "--layers", L, "--act-block", "none")
    assert per_token.returncode == 0, per_token.stderr
    assert moe_cpu.MoELayer.load(tmp_path / "per_token" / f"layer_{L:03d}").act_blocks == (None, None)
    bad = cli("convert", "--checkpoint", path, "--out", tmp_path / "bad", "--layers", L, "--act-block", "48")
    assert bad.returncode != 0 and "'48' is not auto, none, 32, 64, 128 or 256" in bad.stderr
    for source in (path, out / f"layer_{L:03d}"):
        run = cli("run", "--checkpoint", source, "--layer", L, "--tokens", 8, "--min-time", 0.05)
        assert run.returncode == 0, run.stderr
        line = [s for s in run.stdout.splitlines() if "relative L2 error" in s][0]
        err = float(line.split("float64 ")[1].split(",")[0])
        assert 0 < err < 0.05, line          # W4A8 / W8A8 against the dequantized float64 layer


def _retyped(path, name, tid):
    """The GGUF file at path with tensor ``name``'s type id set to ``tid`` in its tensor info (data left as it was)."""
    data = bytearray(path.read_bytes())
    key = name.encode()
    at = data.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)   # tensor info: name, n_dims, ne[], type, offset
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, tid)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("tid", [141, 250], ids=["ik_IQ6_K", "unknown_id"])
def test_types_gguf_py_does_not_know_load_where_the_layer_does_not_read_them(tmp_path, rng, tid):
    """A tensor of a type id gguf-py does not know and moe_cpu does not read (ik_llama.cpp's IQ6_K is 141; 250 is
    nobody's) outside the loaded
    layer leaves the layer loading, bit for bit; in one of the layer's expert tensors it is a ValueError naming the
    tensor, the type (ik's name and id where ik has one) and the types moe_cpu reads."""
    path, keep = moe_file(tmp_path, rng, ("Q4_K", "Q4_K", "Q6_K"))
    _retyped(path, "blk.0.ffn_down_exps.weight", tid)
    _retyped(path, "blk.2.ffn_gate_inp.weight", tid)
    with pytest.raises(ValueError, match="is not a valid GGMLQuantizationType"):
        gguf.GGUFReader(str(path))   # gguf-py's own reader refuses the whole file
    check_layer(rng, load_layer(path, L), keep, 5)
    _retyped(path, f"blk.{L}.ffn_down_exps.weight", tid)
    what = "IQ6_K (type id 141, an ik_llama.cpp type)" if tid == 141 else "type id 250 (unknown to gguf-py and to ik"
    assert_load_raises(tmp_path, path, None, "retyped", [f"blk.{L}.ffn_down_exps.weight", what, "moe_cpu reads Q4_0"])
