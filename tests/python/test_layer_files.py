"""MoELayer.from_pretrained / save / load and the `moe-cpu convert` and `run` commands, on a small
unquantized Qwen3-MoE checkpoint written with the real safetensors writer."""
import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as st

import moe_cpu
from conftest import float_weights, make_input, ref

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

E, H, I, LAYERS = 4, 128, 64, 3


@pytest.fixture
def checkpoint(tmp_path, rng):
    """A 3-layer bf16 Qwen3-MoE checkpoint directory (config.json + model.safetensors)."""
    tensors = {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "gate.weight"] = ref.float_to_bf16_bits(float_weights(rng, 1, E, H)[0]).view(ml_dtypes.bfloat16)
        for e in range(E):
            for p, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                w = float_weights(rng, 1, n, k)[0]
                tensors[f"{pre}experts.{e}.{p}.weight"] = ref.float_to_bf16_bits(w).view(ml_dtypes.bfloat16)
    d = tmp_path / "qwen3"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": H, "num_experts": E, "num_experts_per_tok": 2,
        "moe_intermediate_size": I, "norm_topk_prob": True, "num_hidden_layers": LAYERS}))
    st.save_file(tensors, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("scheme", [None, "int4_w4a8", "int8_w8a8"])
def test_from_pretrained_save_load_round_trip(checkpoint, tmp_path, rng, scheme):
    layer = moe_cpu.MoELayer.from_pretrained(checkpoint, 1, scheme, group_size=32 if scheme == "int4_w4a8" else None)
    assert layer.num_experts == E and layer.top_k == 2 and layer.renormalize
    assert layer.scheme == (scheme or "bf16")
    layer.save(tmp_path / "packed")
    for mmap in (True, False):
        again = moe_cpu.MoELayer.load(tmp_path / "packed", mmap=mmap)
        x = make_input(rng, 11, H)
        np.testing.assert_array_equal(again(x), layer(x))
        assert repr(again) == repr(layer)


def test_load_rejects_a_directory_without_a_layer(tmp_path):
    with pytest.raises(ValueError, match="layer.json"):
        moe_cpu.MoELayer.load(tmp_path)
    (tmp_path / "layer.json").write_text(json.dumps({"format": "something else", "version": 1}))
    with pytest.raises(ValueError, match="not a moe_cpu layer"):
        moe_cpu.MoELayer.load(tmp_path)


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "moe_cpu", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
def test_cli_convert_then_run(checkpoint, tmp_path):
    out = tmp_path / "converted"
    conv = _cli("convert", "--checkpoint", checkpoint, "--out", out, "--layers", "0-1", "--scheme", "int8_w8a8",
                cwd=tmp_path)
    assert conv.returncode == 0, conv.stderr
    assert sorted(p.name for p in out.iterdir()) == ["layer_000", "layer_001"]
    assert (out / "layer_001" / "w13.moe").read_bytes()[:8] == b"MOECPUPK"
    for source in (checkpoint, out / "layer_001"):
        run = _cli("run", "--checkpoint", source, "--layer", 1, "--tokens", 8, "--scheme", "int8_w8a8",
                   "--min-time", 0.05, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        line = [s for s in run.stdout.splitlines() if "relative L2 error" in s][0]
        err = float(line.split("float64 ")[1].split(",")[0])
        assert 0 < err < 0.05, line          # int8 W8A8 against the dequantized float64 layer
        assert ("--layer / --scheme are not used" in run.stderr) == (source != checkpoint)


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
def test_cli_reports_bad_checkpoints_without_a_traceback(tmp_path):
    bad = _cli("run", "--checkpoint", tmp_path / "nothing_here", "--layer", 0, cwd=tmp_path)
    assert bad.returncode == 2
    assert "moe-cpu run: error:" in bad.stderr and "Traceback" not in bad.stderr
    usage = _cli("convert", "--checkpoint", tmp_path, "--out", tmp_path / "o", "--layers", "x", cwd=tmp_path)
    assert usage.returncode == 2 and "layer numbers" in usage.stderr
    for flag, value in (("--tokens", 0), ("--tokens", -3), ("--min-time", -1), ("--min-time", "nan"), ("--calls", 0),
                        ("--layer", -1)):
        usage = _cli("run", "--checkpoint", tmp_path, flag, value, cwd=tmp_path)
        assert usage.returncode == 2 and f"argument {flag}: must be >= " in usage.stderr, (flag, usage.stderr)


def test_router_bias_is_added_to_the_logits_and_saved(tmp_path, rng):
    E2, H2, I2 = 6, 64, 32
    gate = rng.standard_normal((E2, H2)).astype(np.float32)
    bias = (rng.standard_normal(E2) * 3).astype(np.float32)
    w13, w2 = float_weights(rng, E2, 2 * I2, H2), float_weights(rng, E2, H2, I2)
    layer = moe_cpu.MoELayer.from_float(gate, w13, w2, top_k=2, scheme="bf16", gate_bias=bias, renormalize=True)
    x = make_input(rng, 7, H2)
    np.testing.assert_allclose(layer.router_logits(x), x @ gate.T + bias, rtol=1e-5, atol=1e-5)
    layer.save(tmp_path / "biased")
    again = moe_cpu.MoELayer.load(tmp_path / "biased")
    np.testing.assert_array_equal(again.gate_bias, bias)
    np.testing.assert_array_equal(again(x), layer(x))
    with pytest.raises(ValueError, match="gate_bias"):
        moe_cpu.MoELayer.from_float(gate, w13, w2, top_k=2, scheme="bf16", gate_bias=bias[:3])
