"""GPTQ (v1 / v2 zero points, sym / asym, act-order) and AWQ (GEMM) safetensors checkpoints.

The checkpoints are written by the packer below, which follows the published formats and shares no
code with the loader:
- GPTQ: qweight int32 [ceil(K/8), N], input rows 8r..8r+7 in nibbles 0..7 (bits 4i) of word r;
  qzeros int32 [G, ceil(N/8)], columns 8c..8c+7 in nibbles 0..7; scales float16 [G, N]; g_idx int32
  [K] (group of each input channel); weight = (q - zero) * scale. checkpoint_format "gptq" (v1)
  stores zero - 1, "gptq_v2" the zero itself.
- AWQ GEMM: qweight int32 [K, ceil(N/8)] and qzeros int32 [G, ceil(N/8)], nibble i of word c holding
  column 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]; scales float16 [G, N].
Every variant must load losslessly (weights equal to the dequantized checkpoint bit for bit, in the
kernel's channel order) and run like reference.py on the un-permuted weights.
"""
import numpy as np
import pytest

import moe_cpu
from conftest import assert_close, make_input, ref
from moe_cpu.loaders import load_layer
from test_loaders import L, LAYERS, assert_load_raises, bf16, qwen3_config, save_hf

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

AWQ_NIBBLE_COLUMN = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_words(v, order=tuple(range(8))):
    """uint values < 16 [R, C] -> int32 [R, ceil(C/8)]; nibble i of word c = column 8c + order[i]."""
    R, C = v.shape
    padded = np.zeros((R, -(-C // 8) * 8), np.uint64)
    padded[:, :C] = v
    words = np.zeros((R, padded.shape[1] // 8), np.uint64)
    for i in range(8):
        words |= padded[:, order[i]::8] << np.uint64(4 * i)
    return words.astype(np.uint32).view(np.int32)


def gptq_tensors(q, z, s, g_idx, v1):
    """One GPTQ linear: q uint8 [N, K], z uint8 [N, G], s float16 [N, G], g_idx [K]."""
    zs = (z.astype(np.int64) - 1) if v1 else z.astype(np.int64)
    assert zs.min() >= 0
    return {"qweight": np.ascontiguousarray(pack_words(q).T), "qzeros": pack_words(zs.T), "scales": np.ascontiguousarray(s.T),
            "g_idx": g_idx.astype(np.int32)}


def awq_tensors(q, z, s):
    return {"qweight": pack_words(q.T, AWQ_NIBBLE_COLUMN), "qzeros": pack_words(z.T, AWQ_NIBBLE_COLUMN),
            "scales": np.ascontiguousarray(s.T)}


def linear(rng, N, K, g, sym, act):
    """Random codes, zero points (8 when sym), float16 scales and a group map of one linear."""
    G = 1 if g == -1 else K // g
    gl = K if g == -1 else g
    q = rng.integers(0, 16, (N, K)).astype(np.uint8)
    z = np.full((N, G), 8, np.uint8) if sym else rng.integers(1, 16, (N, G)).astype(np.uint8)
    s = (rng.uniform(0.5, 1.5, (N, G)) / (4 * np.sqrt(K))).astype(np.float16)
    g_idx = np.arange(K) // gl
    if act:
        g_idx = np.empty(K, np.int64)
        g_idx[rng.permutation(K)] = np.arange(K) // gl
    return q, z, s, g_idx


def dequant(q, z, s, g_idx):
    """float32 [N, K]: (q - zero[g_idx]) * scale[g_idx], exact in float32."""
    return (q.astype(np.float32) - z[:, g_idx].astype(np.float32)) * s[:, g_idx].astype(np.float32)


VARIANTS = {   # method, checkpoint_format, sym, desc_act, group_size, E, H, I
    "gptq_v1_sym_g32": ("gptq", "gptq", True, False, 32, 4, 64, 64),
    "gptq_v1_asym_act_g32": ("gptq", "gptq", False, True, 32, 4, 64, 64),
    "gptq_v2_asym_act_g64": ("gptq", "gptq_v2", False, True, 64, 3, 128, 64),
    "gptq_v2_sym_act_g128": ("gptq", "gptq_v2", True, True, 128, 2, 128, 128),
    "gptq_v2_asym_act_g16": ("gptq", "gptq_v2", False, True, 16, 3, 64, 48),   # group 16: int8 (lossless)
    "gptq_v2_asym_channel_odd": ("gptq", "gptq_v2", False, False, -1, 3, 64, 37),   # N = I odd, K = I odd
    "awq_g32": ("awq", None, False, False, 32, 4, 64, 64),
    "awq_g128": ("awq", None, False, False, 128, 2, 128, 128),
    "awq_channel_odd": ("awq", None, False, False, -1, 3, 64, 45),
}


def checkpoint(tmp_path, rng, variant):
    meth, fmt, sym, act, g, E, H, I = VARIANTS[variant]
    tensors, want = {}, {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "gate.weight"] = bf16(rng.standard_normal((E, H)).astype(np.float32))
        for e in range(E):
            for p, (N, K) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                q, z, s, gi = linear(rng, N, K, g, sym, act)
                if p == "up_proj" and act:   # gate and up see the same input: GPTQ gives them one order
                    gi = want[(layer, e, "gate_proj")][3]
                t = gptq_tensors(q, z, s, gi, fmt == "gptq") if meth == "gptq" else awq_tensors(q, z, s)
                tensors.update({f"{pre}experts.{e}.{p}.{k}": v for k, v in t.items()})
                want[(layer, e, p)] = (q, z, s, gi)
    qc = {"quant_method": meth, "bits": 4, "group_size": g}
    if meth == "gptq":
        qc.update(desc_act=act, sym=sym, checkpoint_format=fmt)
    else:
        qc.update(zero_point=True, version="gemm")
    cfg = qwen3_config(E, H, I, quantization_config=qc)
    return save_hf(tmp_path / variant, cfg, tensors), want, tensors


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_loads_losslessly_and_runs_like_the_reference(tmp_path, rng, variant):
    meth, fmt, sym, act, g, E, H, I = VARIANTS[variant]
    path, want, tensors = checkpoint(tmp_path, rng, variant)
    lw = load_layer(path, L)   # weight-only: the A16 scheme
    W = {p: np.stack([dequant(*want[(L, e, p)]) for e in range(E)]) for p in ("gate_proj", "up_proj", "down_proj")}
    w13 = np.concatenate([W["gate_proj"], W["up_proj"]], axis=1)        # [E, 2I, H], checkpoint order
    scheme = "int8_w8a16" if g == 16 else "int4_w4a16"
    assert lw.scheme == scheme and lw.w2.scheme == scheme
    # the kernel's order: w2's act-order folded into w13's rows (w2 channels sorted by group)
    g2 = np.stack([want[(L, e, "down_proj")][3] for e in range(E)])
    perm2 = np.argsort(g2, axis=1, kind="stable")
    rows = np.concatenate([perm2, perm2 + I], axis=1)
    np.testing.assert_array_equal(lw.w13.unpack(), np.take_along_axis(w13, rows[:, :, None], axis=1))
    np.testing.assert_array_equal(lw.w2.unpack(), np.take_along_axis(W["down_proj"], perm2[:, None, :], axis=2))
    assert lw.w2.unpack_quantized()["g_idx"] is None                   # folded: no gather for GEMM2
    identity13 = (np.stack([want[(L, e, "gate_proj")][3] for e in range(E)]) == np.arange(H) // (g if g > 0 else H)).all()
    assert lw.w13.form.endswith("+act_order") == (not identity13)
    if scheme == "int4_w4a16":
        assert lw.w13.form.startswith("int4+zeros") != sym              # GPTQ sym: zero 8 -> symmetric int4
    # the layer against the float64 truth of the un-permuted weights
    x = make_input(rng, 19, H)
    layer = moe_cpu.MoELayer.from_weights(lw)
    logits = (x.astype(np.float64) @ lw.gate.T.astype(np.float64)).astype(np.float32)
    tw, ids = ref.select_experts_ref(logits, 2, renormalize=True)
    truth = ref.fused_experts_float64(x, w13, W["down_proj"], tw, ids)
    got = layer(x)
    # A16: int16 activation codes, the checkpoint's exact weights: close to float64 (A8 was 2e-2)
    assert np.linalg.norm(got - truth) <= 1e-3 * np.linalg.norm(truth), variant
    # scheme= overrides for speed: int8 activations, about 1e-2 here
    a8 = load_layer(path, L, scheme="int8_w8a8" if g == 16 else "int4_w4a8")
    assert a8.scheme == ("int8_w8a8" if g == 16 else "int4_w4a8")
    np.testing.assert_array_equal(a8.w13.unpack(), lw.w13.unpack())
    got8 = moe_cpu.MoELayer.from_weights(a8)(x)
    assert 1e-3 * np.linalg.norm(truth) < np.linalg.norm(got8 - truth) <= 2e-2 * np.linalg.norm(truth), variant
    # and against the quantized reference (int16 activations) with the checkpoint's own g_idx
    if scheme == "int4_w4a16":
        def refw(ps):
            qs = np.stack([np.concatenate([want[(L, e, p)][0] for p in ps]) for e in range(E)])
            zs = np.stack([np.concatenate([want[(L, e, p)][1] for p in ps]) for e in range(E)])
            ss = np.stack([np.concatenate([want[(L, e, p)][2] for p in ps]) for e in range(E)]).astype(np.float32)
            return ref.RefWeights.int4(qs, ss, g, zeros=zs, g_idx=np.stack([want[(L, e, ps[0])][3] for e in range(E)]),
                                       scheme=scheme)
        assert_close(got, ref.fused_experts_ref(x, refw(("gate_proj", "up_proj")), refw(("down_proj",)), tw, ids),
                     scheme, variant)


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
def test_convert_and_run_through_the_cli(tmp_path, rng):
    import subprocess
    import sys
    path, _, _ = checkpoint(tmp_path, rng, "gptq_v2_asym_act_g64")
    out = tmp_path / "layer"
    conv = subprocess.run([sys.executable, "-m", "moe_cpu", "convert", "--checkpoint", str(path), "--layers", str(L),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert conv.returncode == 0, conv.stderr[-2000:]
    back = moe_cpu.MoELayer.load(out / f"layer_{L:03d}")
    direct = moe_cpu.MoELayer.from_pretrained(path, L)
    assert back.w13.form == "int4+zeros+act_order"
    x = make_input(rng, 7, back.hidden_size)
    np.testing.assert_array_equal(back(x), direct(x))
    run = subprocess.run([sys.executable, "-m", "moe_cpu", "run", "--checkpoint", str(path), "--layer", str(L),
                          "--tokens", "4"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "int4_w4a16" in run.stdout and "int4_w4a8" not in run.stdout, run.stdout
    run8 = subprocess.run([sys.executable, "-m", "moe_cpu", "run", "--checkpoint", str(path), "--layer", str(L),
                           "--tokens", "4", "--scheme", "int4_w4a8"], capture_output=True, text=True, timeout=300)
    assert run8.returncode == 0 and "int4_w4a8" in run8.stdout, run8.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-m", "moe_cpu", "run", "--checkpoint", str(path), "--scheme", "int4"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "invalid choice: 'int4'" in bad.stderr, bad.stderr


def _bad_gptq(tmp_path, label):
    rng = np.random.default_rng(1)
    path, _, tensors = checkpoint(tmp_path, rng, "gptq_v1_asym_act_g32")
    import json
    cfg = json.loads((path / "config.json").read_text())
    t = f"model.layers.{L}.mlp.experts.1.down_proj."
    if label == "missing_g_idx":
        del tensors[t + "g_idx"]
    elif label == "bits_8":
        cfg["quantization_config"]["bits"] = 8
    elif label == "group_not_dividing_k":
        cfg["quantization_config"]["group_size"] = 48
    elif label == "bad_g_idx":
        tensors[t + "g_idx"] = np.zeros_like(tensors[t + "g_idx"])
    elif label == "g_idx_out_of_range":
        tensors[t + "g_idx"] = tensors[t + "g_idx"] + 5
    elif label == "qweight_wrong_dtype":
        tensors[t + "qweight"] = tensors[t + "qweight"].astype(np.float32)
    elif label == "qzeros_wrong_shape":
        tensors[t + "qzeros"] = tensors[t + "qzeros"][:, :-1].copy()
    elif label == "awq_gemv":
        cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemv"}
    elif label == "gate_up_orders_differ":
        u = f"model.layers.{L}.mlp.experts.0.up_proj.g_idx"
        tensors[u] = np.ascontiguousarray(tensors[u][::-1])
    out = save_hf(tmp_path / "bad", cfg, tensors)
    if label == "truncated":
        f = out / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-4000])
    return out


BAD = [
    ("missing_g_idx", ["missing tensor", "experts.1.down_proj.g_idx"]),
    ("bits_8", ["bits = 8", "only 4-bit"]),
    ("group_not_dividing_k", ["group_size = 48 does not divide", "K = 64"]),
    ("bad_g_idx", ["down_proj.g_idx", "not a valid group map"]),
    ("g_idx_out_of_range", ["down_proj.g_idx", "not a group index"]),
    ("qweight_wrong_dtype", ["down_proj.qweight", "dtype F32"]),
    ("qzeros_wrong_shape", ["down_proj.qzeros", "shape"]),
    ("awq_gemv", ["AWQ version 'gemv'"]),
    ("gate_up_orders_differ", ["different g_idx"]),
    ("truncated", ["safetensors"]),
]


@pytest.mark.parametrize("label,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_checkpoints_raise_clear_errors(tmp_path, label, needles):
    assert_load_raises(tmp_path, _bad_gptq(tmp_path, label), None, label, needles)


@pytest.mark.parametrize("variant", ["gptq_v2_asym_act_g64", "awq_g32"])
def test_a16_layer_matches_transformers_block(tmp_path, rng, variant):
    """transformers as the oracle: Qwen3-MoE's sparse block on the checkpoint's dequantized weights. The
    weight-only checkpoint loads as A16 and matches it to fp32 rounding; scheme='int4_w4a8' costs about 1%."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    meth, fmt, sym, act, g, E, H, I = VARIANTS[variant]
    path, want, tensors = checkpoint(tmp_path, rng, variant)
    cfg = {k: v for k, v in qwen3_config(E, H, I).items() if k != "model_type"}
    block = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(transformers.AutoConfig.for_model("qwen3_moe", **cfg)).float().eval()
    W = {p: np.stack([dequant(*want[(L, e, p)]) for e in range(E)]) for p in ("gate_proj", "up_proj", "down_proj")}
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(ref.bf16_bits_to_float(tensors[f"model.layers.{L}.mlp.gate.weight"])))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([W["gate_proj"], W["up_proj"]], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(W["down_proj"]))
    x = make_input(rng, 23, H)
    with torch.no_grad():
        y = block(torch.from_numpy(x)[None])
    oracle = (y[0] if isinstance(y, tuple) else y)[0].numpy().astype(np.float64)
    layer = moe_cpu.MoELayer.from_pretrained(path, L)
    assert layer.scheme == "int4_w4a16" and "int4_w4a16" in repr(layer)
    rel = np.linalg.norm(layer(x) - oracle) / np.linalg.norm(oracle)
    assert rel <= 5e-4, f"{variant}: A16 relative L2 {rel:.2e} against transformers"
    a8 = moe_cpu.MoELayer.from_pretrained(path, L, scheme="int4_w4a8")
    rel8 = np.linalg.norm(a8(x) - oracle) / np.linalg.norm(oracle)
    print(f"\n{variant}: relative L2 against transformers' block: A16 {rel:.2e}, A8 {rel8:.2e}")
    assert 3 * rel < rel8 <= 3e-2, f"{variant}: A8 relative L2 {rel8:.2e}, A16 {rel:.2e}"
