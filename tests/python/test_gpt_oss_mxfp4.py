"""gpt-oss MXFP4 safetensors, the original release layout: ``*_blocks`` uint8 [E, N, K/32, 16] and
``*_scales`` uint8 [E, N, K/32] plus bf16 biases, loaded losslessly into int4 with the MXFP4 codebook.

Oracles: transformers' own dequantizer (``transformers.integrations.mxfp4.convert_moe_packed_tensors``)
for ``unpack()``, bit for bit over every e8m0 byte and every code, and the transformers gpt-oss MoE
block on those dequantized weights for the layer's output. A hand-written decode of the layout
stands beside them.
"""
import json

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as st

import moe_cpu
from conftest import assert_close, ref
from moe_cpu.loaders import load_layer
from test_gguf_quants import ref_of
from test_loaders import L, assert_load_raises

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

torch = pytest.importorskip("torch")
mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")

E, H, I = 4, 64, 96
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _config(**kw):
    return {"model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I, "num_local_experts": E,
            "num_experts_per_tok": 2, "num_hidden_layers": L + 1, "swiglu_limit": 7.0,
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                       "model.layers.*.mlp.router"]},
            **kw}


def _blocks(rng, N, K, scales):
    return rng.integers(0, 256, (E, N, K // 32, 16), dtype=np.uint8), scales(rng, (E, N, K // 32))


def write_checkpoint(d, rng, scales, bias=0.3):
    """One gpt-oss layer L in the release's MXFP4 layout; `scales(rng, shape)` draws the e8m0 bytes."""
    pre = f"model.layers.{L}.mlp."
    bf = lambda a: a.astype(ml_dtypes.bfloat16)  # noqa: E731
    b13, s13 = _blocks(rng, 2 * I, H, scales)
    b2, s2 = _blocks(rng, H, I, scales)
    t = {pre + "experts.gate_up_proj_blocks": b13, pre + "experts.gate_up_proj_scales": s13,
         pre + "experts.down_proj_blocks": b2, pre + "experts.down_proj_scales": s2,
         pre + "experts.gate_up_proj_bias": bf(rng.standard_normal((E, 2 * I)) * bias),
         pre + "experts.down_proj_bias": bf(rng.standard_normal((E, H)) * bias),
         pre + "router.weight": bf(rng.standard_normal((E, H)) * 0.2),
         pre + "router.bias": bf(rng.standard_normal(E) * bias)}
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(_config()))
    st.save_file(t, str(d / "model.safetensors"))
    return t


def transformers_dequant(blocks, scales):
    """[E, N, K] float32 from transformers' dequantizer (which returns [E, K, N])."""
    w = mxfp4.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    return w.transpose(1, 2).contiguous().numpy()


def hand_dequant(blocks, scales):
    """The layout as published: low nibble = even element, value e2m1 * 2^(e - 127)."""
    codes = np.stack([blocks & 15, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
    with np.errstate(over="ignore"):   # 6 * 2^127 is inf in float32, as in transformers
        w = E2M1[codes] * np.ldexp(np.float32(1), scales.astype(np.int32) - 127)[..., None]
    return w.reshape(*blocks.shape[:2], -1).astype(np.float32)


def test_unpack_bit_exact_every_e8m0_byte(tmp_path, rng):
    """Every finite e8m0 byte (0..254; 0xFF is NaN and raises, test_bad_mxfp4_checkpoints) and every code."""
    every = lambda rng, shape: rng.permutation(np.resize(np.arange(255, dtype=np.uint8), shape).ravel()).reshape(shape)  # noqa: E731
    t = write_checkpoint(tmp_path / "ck", rng, every)
    lw = load_layer(tmp_path / "ck", L)
    assert lw.w13.form == "int4+codebook" and lw.w13.group_size == 32 and lw.config.activation == "swigluoai"
    pre = f"model.layers.{L}.mlp.experts."
    for w, name in ((lw.w13, "gate_up_proj"), (lw.w2, "down_proj")):
        b, s = t[pre + name + "_blocks"], t[pre + name + "_scales"]
        want = transformers_dequant(b, s)
        got = w.unpack()
        # Bit for bit (2^-127 .. 2^127 scales, subnormal products too), except that e2m1's -0 (code 8) unpacks as +0:
        # the int8 codebook has one zero, and a zero weight adds nothing either way.
        np.testing.assert_array_equal(got, want, err_msg=name)
        nz = want != 0
        np.testing.assert_array_equal(got[nz].view(np.uint32), want[nz].view(np.uint32), err_msg=name)
        np.testing.assert_array_equal(got, hand_dequant(b, s), err_msg=name)
    np.testing.assert_array_equal(lw.w2_bias, t[pre + "down_proj_bias"].astype(np.float32))


def _moderate(rng, shape):
    return rng.integers(119, 124, shape, dtype=np.uint8)   # |w| up to 6 * 2^-4: a well-scaled layer


@pytest.mark.parametrize("M", [0, 1, 3, 257])
def test_layer_matches_transformers_block(tmp_path, rng, M):
    """The whole layer against transformers' GptOssMLP on the dequantized weights, and fused_experts
    against moe_cpu/reference.py on the same codes."""
    import transformers

    t = write_checkpoint(tmp_path / "ck", rng, _moderate)
    layer = moe_cpu.MoELayer.from_pretrained(tmp_path / "ck", L)
    cfg = transformers.AutoConfig.for_model("gpt_oss", **{k: v for k, v in _config().items()
                                                          if k not in ("quantization_config", "model_type")})
    block = transformers.models.gpt_oss.modeling_gpt_oss.GptOssMLP(cfg).float().eval()
    pre = f"model.layers.{L}.mlp."
    f32 = lambda n: torch.from_numpy(t[pre + n].astype(np.float32))  # noqa: E731
    with torch.no_grad():
        block.router.weight.copy_(f32("router.weight"))
        block.router.bias.copy_(f32("router.bias"))
        for name in ("gate_up_proj", "down_proj"):
            deq = transformers_dequant(t[pre + f"experts.{name}_blocks"], t[pre + f"experts.{name}_scales"])
            getattr(block.experts, name).copy_(torch.from_numpy(deq.transpose(0, 2, 1).copy()))
            getattr(block.experts, name + "_bias").copy_(f32(f"experts.{name}_bias"))
    x = rng.standard_normal((M, H)).astype(np.float32)
    got = layer(x)
    if M == 0:
        assert got.shape == (0, H)
        return
    with torch.no_grad():
        y = block(torch.from_numpy(x)[None])
    want = (y[0] if isinstance(y, tuple) else y)[0].numpy().astype(np.float64)
    # The weights are exact: the float64 path on them is transformers' output up to fp32 rounding.
    rel = np.linalg.norm(layer.reference(x) - want) / np.linalg.norm(want)
    assert rel <= 1e-5, f"reference: relative L2 {rel:.2e} against transformers"
    # MXFP4 is weight-only: the layer runs int4_w4a16 (int16 activation codes per token), close to
    # transformers (the W4A8 kernels' per-token int8 activations cost about 1%).
    assert layer.scheme == "int4_w4a16"
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"\nM={M}: int4_w4a16 relative L2 against transformers {rel:.2e}")
    assert rel <= 5e-4, f"relative L2 {rel:.2e} against transformers"
    tw, ids = layer.route(x)
    want_ref = ref.fused_experts_ref(x, ref_of(layer.w13), ref_of(layer.w2), tw, ids, activation="swigluoai",
                                     w13_bias=layer.w13_bias, w2_bias=layer.w2_bias)
    assert_close(moe_cpu.fused_experts(x, layer.w13, layer.w2, tw, ids, activation="swigluoai",
                                       w13_bias=layer.w13_bias, w2_bias=layer.w2_bias),
                 want_ref, "int4_w4a16", "fused_experts vs reference.py")


@pytest.mark.parametrize("case", ["dtype", "shape", "quant_method", "k", "nan_scale", "truncated"])
def test_bad_mxfp4_checkpoints(tmp_path, rng, case):
    d = tmp_path / case
    t = write_checkpoint(d, rng, _moderate)
    pre = f"model.layers.{L}.mlp.experts."
    cfg = _config()
    if case == "dtype":
        t[pre + "down_proj_scales"] = t[pre + "down_proj_scales"].astype(np.int16)
        needles = [pre + "down_proj_scales", "dtype I16", "U8"]
    elif case == "shape":
        t[pre + "gate_up_proj_blocks"] = np.ascontiguousarray(t[pre + "gate_up_proj_blocks"][:, :-2])
        needles = [pre + "gate_up_proj_blocks", "shape", str([E, 2 * I, H // 32, 16])]
    elif case == "quant_method":
        cfg["quantization_config"]["quant_method"] = "awq"
        needles = [pre + "gate_up_proj_blocks", "quant_method is 'awq'"]
    elif case == "k":
        cfg["intermediate_size"] = I + 8
        needles = ["multiple of 32", str(I + 8)]
    elif case == "nan_scale":
        t[pre + "down_proj_scales"][2, 5, 1] = 255
        needles = [pre + "down_proj_scales", "expert 2, row 5, block 1", "NaN"]
    (d / "config.json").write_text(json.dumps(cfg))
    st.save_file(t, str(d / "model.safetensors"))
    if case == "truncated":
        f = d / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-3000])
        needles = ["model.safetensors"]
    assert_load_raises(tmp_path, d, None, case, needles)


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
def test_cli_convert_and_run(tmp_path, rng):
    import subprocess
    import sys

    write_checkpoint(tmp_path / "ck", rng, _moderate)
    for args in (["convert", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "out"), "--layers", str(L)],
                 ["run", "--checkpoint", str(tmp_path / "ck"), "--layer", str(L)]):
        r = subprocess.run([sys.executable, "-m", "moe_cpu", *args], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
    assert "int4+codebook" in r.stdout and "relative L2 error vs float64" in r.stdout
    back = moe_cpu.MoELayer.load(tmp_path / "out" / f"layer_{L:03d}")
    lw = load_layer(tmp_path / "ck", L)
    for a, b in ((back.w13, lw.w13), (back.w2, lw.w2)):
        assert a.form == "int4+codebook"
        np.testing.assert_array_equal(a.unpack(), b.unpack())
