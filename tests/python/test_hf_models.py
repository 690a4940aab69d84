"""Hugging Face checkpoints as transformers writes them: configs of transformers 4 and 5, and tiny
random models of five MoE families saved by ``save_pretrained``, loaded by moe_cpu and compared with
the family's own sparse MoE block run by transformers (the oracle) on the same tokens.

torch and transformers are test-only dependencies (scripts/setup.sh installs torch==2.13.0, CPU,
and transformers); the runtime never imports them (test_import_without_torch).
"""
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import moe_cpu
from moe_cpu.loaders import load_layer
from moe_cpu.loaders.config import config_from_hf

CONFIGS = pathlib.Path(__file__).parent / "data" / "hf_configs"
sys.path.insert(0, str(CONFIGS))
from tiny_models import FAMILIES, config_kwargs  # noqa: E402

# What each family's tiny config means for one MoE layer, from the arguments given to transformers
# (tiny_models.py) and the families' documented defaults, not from our reader.
EXPECTED = {
    "qwen3_moe": dict(num_experts=8, top_k=2, intermediate_size=32, renormalize=True, scoring_func="softmax",
                      shared_intermediate_size=None, activation="silu"),
    "qwen2_moe": dict(num_experts=8, top_k=2, intermediate_size=32, renormalize=False, scoring_func="softmax",
                      shared_intermediate_size=48, activation="silu"),
    "mixtral": dict(num_experts=8, top_k=2, intermediate_size=96, renormalize=True, scoring_func="softmax",
                    shared_intermediate_size=None, activation="silu"),
    "deepseek_v3": dict(num_experts=8, top_k=3, intermediate_size=32, renormalize=True, scoring_func="sigmoid",
                        use_grouped_topk=True, num_expert_group=4, topk_group=2, routed_scaling_factor=2.5,
                        shared_intermediate_size=32, activation="silu"),
    "gpt_oss": dict(num_experts=8, top_k=2, intermediate_size=96, renormalize=True, scoring_func="softmax",
                    shared_intermediate_size=None, activation="swigluoai"),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("major", [4, 5])
def test_config_as_transformers_writes_it(family, major):
    """config.json saved by transformers 4.57.6 and 5.23.0 (make_configs.py) reads the same."""
    cfg = json.loads((CONFIGS / f"{family}.v{major}.json").read_text())
    c = config_from_hf(cfg, 0)
    assert c.model_type == family and c.hidden_size == 64
    for key, want in EXPECTED[family].items():
        assert getattr(c, key) == want, (family, major, key)


def test_renamed_keys_disagreeing_raise():
    cfg = json.loads((CONFIGS / "qwen3_moe.v5.json").read_text())
    cfg["num_experts"] = 16      # transformers 4's name beside 5's num_local_experts = 8
    with pytest.raises(ValueError, match="num_experts = 16 and num_local_experts = 8 disagree"):
        config_from_hf(cfg, 0)
    del cfg["num_experts"], cfg["num_local_experts"]
    with pytest.raises(ValueError, match="'num_experts' is missing .also accepted: num_local_experts, n_routed_experts"):
        config_from_hf(cfg, 0)
    oss = json.loads((CONFIGS / "gpt_oss.v5.json").read_text())
    oss["swiglu_alpha"] = 1.5
    with pytest.raises(ValueError, match="swiglu_alpha = 1.5 is not supported"):
        config_from_hf(oss, 0)


# ------------------------------------------------------------------ transformers as the oracle
@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """family -> (directory saved by save_pretrained in bf16, the model in fp32 on the same weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    out = {}
    for i, family in enumerate(FAMILIES):
        torch.manual_seed(100 + i)
        cfg = transformers.AutoConfig.for_model(family, **config_kwargs(family))
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():   # make every bias and correction term matter
            for layer in model.model.layers:
                for name, t in list(layer.mlp.named_parameters()) + list(layer.mlp.named_buffers()):
                    if name.endswith("bias") or "correction" in name or "shared_expert_gate" in name:
                        t.copy_(torch.randn_like(t) * (0.5 if "correction" in name else 0.3))
        model = model.to(torch.bfloat16)
        d = tmp_path_factory.mktemp(family)
        model.save_pretrained(d)
        out[family] = (d, model.float().eval())
    return out


def _block_out(model, layer_idx, x):
    import torch

    with torch.no_grad():
        y = model.model.layers[layer_idx].mlp(torch.from_numpy(x)[None])
    return (y[0] if isinstance(y, tuple) else y)[0].numpy().astype(np.float64)


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_matches_transformers_block(hf_models, family, rng):
    d, model = hf_models[family]
    for layer_idx in (0, 1):
        layer = moe_cpu.MoELayer.from_pretrained(d, layer_idx, scheme="bf16")
        x = rng.standard_normal((13, 64)).astype(np.float32)
        want = _block_out(model, layer_idx, x)
        got = layer(x).astype(np.float64)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel <= 1e-2, f"{family} layer {layer_idx}: relative L2 {rel:.2e}"
        # the NumPy float64 path of the same layer agrees too (routing and biases, without bf16 activations)
        ref_rel = np.linalg.norm(layer.reference(x) - want) / np.linalg.norm(want)
        assert ref_rel <= 1e-5, f"{family} layer {layer_idx}: reference relative L2 {ref_rel:.2e}"


def test_checkpoint_terms_are_read(hf_models):
    """The non-zero terms reach the layer: DeepSeek's correction bias, gpt-oss' biases, Qwen2's gate."""
    import torch

    d, model = hf_models["deepseek_v3"]
    lw = load_layer(d, 1)
    np.testing.assert_array_equal(lw.e_score_correction_bias,
                                  model.model.layers[1].mlp.gate.e_score_correction_bias.numpy())
    d, model = hf_models["gpt_oss"]
    lw = load_layer(d, 0)
    ex = model.model.layers[0].mlp.experts
    np.testing.assert_array_equal(lw.w2_bias, ex.down_proj_bias.detach().numpy())
    assert np.abs(lw.w13_bias).max() > 0.1 and np.abs(lw.gate_bias).max() > 0.1
    d, model = hf_models["qwen2_moe"]
    layer = moe_cpu.MoELayer.from_pretrained(d, 0)
    g = model.model.layers[0].mlp.shared_expert_gate.weight.detach().numpy()[0]
    np.testing.assert_array_equal(layer.shared_expert_gate, g)
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    want = torch.sigmoid(torch.from_numpy(x) @ torch.from_numpy(g)).numpy()
    np.testing.assert_allclose(layer.shared_gate(x), want, rtol=1e-6, atol=1e-7)


def test_import_without_torch(tmp_path):
    """moe_cpu imports and runs a layer with torch blocked from import (a meta-path hook)."""
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers", "jax"):
                    raise ImportError(f"blocked: {name}")
        sys.meta_path.insert(0, Block())
        import numpy as np
        import moe_cpu, moe_cpu.loaders, moe_cpu.vllm_compat
        rng = np.random.default_rng(0)
        E, H, I = 4, 64, 32
        layer = moe_cpu.MoELayer.from_float(rng.standard_normal((E, H)).astype(np.float32),
                                            rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.1,
                                            rng.standard_normal((E, H, I)).astype(np.float32) * 0.1,
                                            top_k=2, scheme="int8_w8a8")
        x = rng.standard_normal((5, H)).astype(np.float32)
        err = np.abs(layer(x) - layer.reference(x)).max() / np.abs(layer.reference(x)).max()
        assert err < 0.05, err
        assert not any(m.split(".")[0] in ("torch", "transformers") for m in sys.modules), "torch was imported"
        print("ok", err)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
