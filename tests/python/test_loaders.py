"""moe_cpu.loaders.load_layer: checkpoints written with the real writer libraries (safetensors,
gguf) load bit-exactly (codes and scales as written) and run through fused_experts like the
reference; bad files raise a clear ValueError (each in a subprocess)."""
import json
import math
import subprocess
import sys
import textwrap

import gguf  # test dependencies (pyproject [test]): the real writer libraries
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as st

import moe_cpu
from conftest import assert_close, float_weights, make_input, make_routing, ref
from moe_cpu.loaders import LayerWeights, load_layer, safetensors_loader

T = gguf.GGMLQuantizationType

LAYERS, L = 3, 1            # every checkpoint has 3 layers; the tests load layer 1


# ------------------------------------------------------------------------------- helpers
def save_hf(d, config, tensors, shards=1):
    """config.json + safetensors (split into `shards` files with an index when > 1)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if shards == 1:
        st.save_file(tensors, str(d / "model.safetensors"))
        return d
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        st.save_file({n: tensors[n] for n in part}, str(d / fname))
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


def bf16(x):
    """float32 -> ml_dtypes.bfloat16 array (round to nearest even)."""
    return ref.float_to_bf16_bits(x).view(ml_dtypes.bfloat16)


def qwen3_config(E, H, I, **kw):
    return {"model_type": "qwen3_moe", "hidden_size": H, "num_experts": E, "num_experts_per_tok": 2,
            "moe_intermediate_size": I, "norm_topk_prob": True, "num_hidden_layers": LAYERS, **kw}


def ct_config(bits, g, fmt):
    """compressed-tensors quantization_config: W4A8 / W8A8 with dynamic per-token activations."""
    w = {"num_bits": bits, "type": "int", "symmetric": True, "dynamic": False,
         "strategy": "group" if g > 0 else "channel", "group_size": g if g > 0 else None}
    act = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head", "re:.*mlp.gate$"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": act}}}


def pack_int32(q, bits=4):
    """compressed-tensors packing: element 8j+i -> bits [4i, 4i+4) of word j, stored q + 8, zero padded."""
    pf = 32 // bits
    N, K = q.shape
    u = np.zeros((N, -(-K // pf) * pf), np.uint32)
    u[:, :K] = (q.astype(np.int32) + (1 << (bits - 1))).astype(np.uint32)
    packed = np.zeros((N, u.shape[1] // pf), np.uint32)
    for i in range(pf):
        packed |= u[:, i::pf] << np.uint32(bits * i)
    return packed.view(np.int32)


def check_moe(rng, lw, w13r, w2r, M=24, k=2):
    """fused_experts with the loaded weights against the reference on the written codes."""
    E, H = lw.w13.num_experts, lw.w13.in_features
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    kw = dict(activation=lw.config.activation, w13_bias=lw.w13_bias, w2_bias=lw.w2_bias)
    got = moe_cpu.fused_experts(x, lw.w13, lw.w2, tw, ids, **kw)
    assert_close(got, ref.fused_experts_ref(x, w13r, w2r, tw, ids, **kw), lw.scheme, "loaded layer")


def assert_codes(packed, **expected):
    got = packed.unpack_quantized()
    for key, want in expected.items():
        np.testing.assert_array_equal(got[key], want, err_msg=key)


# ---------------------------------------------------------------------- compressed-tensors
@pytest.mark.isa
@pytest.mark.parametrize("fmt", ["pack-quantized", "int-quantized"])
@pytest.mark.parametrize("g", [32, 64, 128, -1])
def test_compressed_tensors_int4(tmp_path, rng, fmt, g):
    E, H = 4, 256
    I = 100 if g == -1 else 128        # per channel: K = I not a multiple of 8 (packing pads)
    tensors, keep = {}, {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "gate.weight"] = bf16(float_weights(rng, 1, E, H)[0])
        for e in range(E):
            for proj, (N, K) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                q, s = ref.quantize_int4(float_weights(rng, 1, N, K), g)
                q, s = q[0], s[0]
                q[(q == -7) & (rng.random(q.shape) < 0.5)] = -8        # legal edge code
                m = f"{pre}experts.{e}.{proj}."
                if g == -1:
                    tensors[m + "weight_scale"] = s                       # fp32 per channel
                else:
                    s = ref.bf16_round(s)
                    tensors[m + "weight_scale"] = bf16(s)                 # bf16 per group
                if fmt == "pack-quantized":
                    tensors[m + "weight_packed"] = pack_int32(q)
                    tensors[m + "weight_shape"] = np.array([N, K], np.int64)
                else:
                    tensors[m + "weight"] = q
                if layer == L:
                    keep[e, proj] = (q, s)
    tensors[f"model.layers.{L}.self_attn.q_proj.weight"] = bf16(np.ones((H, H), np.float32))
    cfg = qwen3_config(E, H, I, quantization_config=ct_config(4, g, fmt))
    path = save_hf(tmp_path / "ckpt", cfg, tensors, shards=2 if g == 64 else 1)
    lw = load_layer(path, L)
    assert isinstance(lw, LayerWeights) and lw.scheme == "int4_w4a8"
    assert (lw.w13.group_size, lw.w2.group_size) == (g, g)
    stack = lambda proj, i: np.stack([keep[e, proj][i] for e in range(E)])  # noqa: E731
    q13 = np.concatenate([stack("gate_proj", 0), stack("up_proj", 0)], axis=1)
    s13 = np.concatenate([stack("gate_proj", 1), stack("up_proj", 1)], axis=1)
    assert_codes(lw.w13, qweight=q13, scales=s13)
    assert_codes(lw.w2, qweight=stack("down_proj", 0), scales=stack("down_proj", 1))
    np.testing.assert_array_equal(lw.gate, tensors[f"model.layers.{L}.mlp.gate.weight"].astype(np.float32))
    c = lw.config
    assert (c.model_type, c.num_experts, c.top_k, c.renormalize, c.hidden_size, c.intermediate_size) == \
           ("qwen3_moe", E, 2, True, H, I)
    check_moe(rng, lw, ref.RefWeights.int4(q13, s13, g), ref.RefWeights.int4(stack("down_proj", 0),
                                                                             stack("down_proj", 1), g))


@pytest.mark.isa
@pytest.mark.parametrize("acts", ["dynamic", "none", "static"])
@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_int8_mixtral_odd_I(tmp_path, rng, strategy, acts):
    """W8A8 per channel (or one scale per tensor, broadcast), Mixtral naming
    (block_sparse_moe.experts.N.w1/w3/w2), odd I. Without input_activations (W8A16, weight-only) the layer
    loads as int8_w8a16; scheme= still picks either. Static activation scales stay refused."""
    weight_only = acts == "none"
    E, H, I = 8, 64, 45
    tensors, q_all, s_all = {}, {}, {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.block_sparse_moe."
        tensors[pre + "gate.weight"] = float_weights(rng, 1, E, H)[0]
        for e in range(E):
            for w, (N, K) in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
                q, s = ref.quantize_int8(float_weights(rng, 1, N, K))
                q[(q == -127) & (rng.random(q.shape) < 0.5)] = -128
                tensors[f"{pre}experts.{e}.{w}.weight"] = q[0]
                if strategy == "tensor":
                    tensors[f"{pre}experts.{e}.{w}.weight_scale"] = s[0].max(keepdims=True)[0]     # shape [1]
                    s = np.full_like(s, s.max())
                else:
                    tensors[f"{pre}experts.{e}.{w}.weight_scale"] = s[0]
                q_all[layer, e, w], s_all[layer, e, w] = q[0], s[0]
    cfg = {"model_type": "mixtral", "hidden_size": H, "num_local_experts": E, "num_experts_per_tok": 2,
           "intermediate_size": I, "num_hidden_layers": LAYERS,
           "quantization_config": ct_config(8, -1, "int-quantized")}
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = strategy
    if weight_only:
        del cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"]
    if acts == "static":
        cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"].update(dynamic=False, strategy="tensor")
    path = save_hf(tmp_path / "mix", cfg, tensors)
    if acts == "static":
        for scheme in (None, "int8_w8a16"):
            with pytest.raises(ValueError, match="input_activations must be dynamic per-token 8-bit"):
                load_layer(path, L, scheme=scheme)
        return
    lw = load_layer(path, L)
    scheme = "int8_w8a16" if weight_only else "int8_w8a8"
    get = lambda d, w: np.stack([d[L, e, w] for e in range(E)])  # noqa: E731
    q13 = np.concatenate([get(q_all, "w1"), get(q_all, "w3")], axis=1)
    s13 = np.concatenate([get(s_all, "w1"), get(s_all, "w3")], axis=1)
    assert lw.scheme == scheme and lw.w2.scheme == scheme and lw.config.renormalize and lw.config.top_k == 2
    assert_codes(lw.w13, qweight=q13, scales=s13)
    assert_codes(lw.w2, qweight=get(q_all, "w2"), scales=get(s_all, "w2"))
    check_moe(rng, lw, ref.RefWeights.int8(q13, s13, scheme=scheme),
              ref.RefWeights.int8(get(q_all, "w2"), get(s_all, "w2"), scheme=scheme))
    other = "int8_w8a8" if weight_only else "int8_w8a16"
    assert load_layer(path, L, scheme=other).scheme == other
    with pytest.raises(ValueError, match="would need requantization"):
        load_layer(path, L, scheme="int4_w4a16")


# ---------------------------------------------------------------------------- DeepSeek FP8
def fp8_expert(rng, N, K, block=(128, 128)):
    codes, s = ref.quantize_fp8(float_weights(rng, 1, N, K), block)
    return codes[0], s[0]


def expand_rows(s, bn, bn_eff, n):
    """[ceil(n/bn), kb] block scales -> [ceil(n/bn_eff), kb] (each row block split in bn/bn_eff)."""
    return np.repeat(s, bn // bn_eff, axis=0)[: -(-n // bn_eff)]


@pytest.mark.isa
@pytest.mark.parametrize("I", [96, 45])
def test_deepseek_v3_fp8(tmp_path, rng, I):
    E, H, bn = 8, 256, 128
    tensors, keep = {}, {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        if layer == 0:                                    # first_k_dense_replace = 1: a dense MLP
            tensors[pre + "gate_proj.weight"] = bf16(float_weights(rng, 1, 2 * I, H)[0])
            continue
        tensors[pre + "gate.weight"] = bf16(float_weights(rng, 1, E, H)[0])
        tensors[pre + "gate.e_score_correction_bias"] = rng.standard_normal(E).astype(np.float32)
        mods = [(f"experts.{e}.{p}", e, p) for e in range(E) for p in ("gate_proj", "up_proj", "down_proj")]
        mods += [(f"shared_experts.{p}", "s", p) for p in ("gate_proj", "up_proj", "down_proj")]
        for m, e, p in mods:
            codes, s = fp8_expert(rng, *((H, I) if p == "down_proj" else (I, H)))
            tensors[pre + m + ".weight"] = codes.view(ml_dtypes.float8_e4m3fn)
            tensors[pre + m + ".weight_scale_inv"] = s
            if layer == L:
                keep[e, p] = (codes, s)
    cfg = {"model_type": "deepseek_v3", "hidden_size": H, "n_routed_experts": E, "num_experts_per_tok": 2,
           "moe_intermediate_size": I, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc",
           "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
           "n_shared_experts": 1, "first_k_dense_replace": 1, "num_hidden_layers": LAYERS,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [bn, 128]}}
    lw = load_layer(save_hf(tmp_path / "ds", cfg, tensors), L)
    bn_eff = math.gcd(I, bn)                               # gate/up row blocks must not straddle
    assert lw.scheme == "fp8_w8a16" and lw.w13.block_size == (bn_eff, 128) and lw.w2.block_size == (bn, 128)

    def w13_of(e):
        (cg, sg), (cu, su) = keep[e, "gate_proj"], keep[e, "up_proj"]
        return np.concatenate([cg, cu]), np.concatenate([expand_rows(sg, bn, bn_eff, I),
                                                         expand_rows(su, bn, bn_eff, I)])
    c13, s13 = (np.stack(a) for a in zip(*[w13_of(e) for e in range(E)]))
    c2, s2 = (np.stack(a) for a in zip(*[keep[e, "down_proj"] for e in range(E)]))
    assert_codes(lw.w13, weight=c13, scale_inv=s13)
    assert_codes(lw.w2, weight=c2, scale_inv=s2)
    np.testing.assert_array_equal(lw.e_score_correction_bias,
                                  tensors[f"model.layers.{L}.mlp.gate.e_score_correction_bias"])
    c = lw.config
    assert (c.scoring_func, c.use_grouped_topk, c.num_expert_group, c.topk_group, c.routed_scaling_factor,
            c.renormalize, c.shared_intermediate_size) == ("sigmoid", True, 4, 2, 2.5, True, I)
    w13r, w2r = ref.RefWeights.fp8(c13, s13, (bn_eff, 128)), ref.RefWeights.fp8(c2, s2, (bn, 128))
    check_moe(rng, lw, w13r, w2r)
    # shared expert: codes as written, numerics as the reference
    (cg, sg), (cu, su), (cd, sd) = (keep["s", p] for p in ("gate_proj", "up_proj", "down_proj"))
    sc13 = np.concatenate([expand_rows(sg, bn, bn_eff, I), expand_rows(su, bn, bn_eff, I)])[None]
    assert_codes(lw.shared_w13, weight=np.concatenate([cg, cu])[None], scale_inv=sc13)
    x = make_input(rng, 8, H)
    fused = np.zeros((8, H), np.float32)
    got = moe_cpu.shared_expert(x, lw.shared_w13, lw.shared_w2, fused)
    want = ref.shared_expert_ref(x, ref.RefWeights.fp8(np.concatenate([cg, cu])[None], sc13, (bn_eff, 128)),
                                 ref.RefWeights.fp8(cd[None], sd[None], (bn, 128)), fused)
    assert_close(got, want, "fp8_w8a16", "shared expert")
    # MoELayer.from_weights chains the same calls
    layer = moe_cpu.MoELayer.from_weights(lw)
    logits = layer.router_logits(x)   # the router's own fp32 GEMM (its order, not NumPy's)
    np.testing.assert_allclose(logits, x.astype(np.float64) @ lw.gate.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    tw, ids = moe_cpu.select_experts(logits, 2, e_score_correction_bias=lw.e_score_correction_bias,
                                     **c.routing_kwargs())
    manual = moe_cpu.shared_expert(x, lw.shared_w13, lw.shared_w2, moe_cpu.fused_experts(x, lw.w13, lw.w2, tw, ids))
    np.testing.assert_array_equal(layer(x), manual)


# ------------------------------------------------------------- unquantized, quantize on load
@pytest.mark.isa
@pytest.mark.parametrize("scheme,g", [("bf16", None), ("int4_w4a8", 32), ("int8_w8a8", None), ("fp8_w8a16", None),
                                      (None, None)])
def test_quantize_on_load_matches_quantize_experts(tmp_path, rng, monkeypatch, scheme, g):
    E, H, I = 4, 128, 64
    tensors, w = {}, {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "gate.weight"] = bf16(float_weights(rng, 1, E, H)[0])
        for e in range(E):
            for p, (N, K) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                tensors[f"{pre}experts.{e}.{p}.weight"] = bf16(float_weights(rng, 1, N, K)[0])
                w[layer, e, p] = tensors[f"{pre}experts.{e}.{p}.weight"].astype(np.float32)
    path = save_hf(tmp_path / "q3", qwen3_config(E, H, I), tensors)
    shapes = []                            # streaming: quantize_experts only ever sees one expert
    real = moe_cpu.quantize_experts
    monkeypatch.setattr(moe_cpu.api, "quantize_experts",
                        lambda a, *args: shapes.append(a.shape) or real(a, *args))
    lw = load_layer(path, L, scheme, group_size=g)
    assert {s[0] for s in shapes} == {1}
    w13 = np.stack([np.concatenate([w[L, e, "gate_proj"], w[L, e, "up_proj"]]) for e in range(E)])
    w2 = np.stack([w[L, e, "down_proj"] for e in range(E)])
    want13, want2 = (real(a, scheme or "bf16", g) for a in (w13, w2))
    assert lw.scheme == (scheme or "bf16") and lw.w13.group_size == want13.group_size
    for got, want in ((lw.w13, want13), (lw.w2, want2)):
        assert_codes(got, **{k: v for k, v in want.unpack_quantized().items() if v is not None})
    if lw.scheme == "bf16":                # a BF16 checkpoint loads as bf16 bit for bit
        assert_codes(lw.w13, weight=ref.float_to_bf16_bits(w13))
    x = make_input(rng, 16, H)
    tw, ids = make_routing(rng, 16, E, 2)
    np.testing.assert_array_equal(moe_cpu.fused_experts(x, lw.w13, lw.w2, tw, ids),
                                  moe_cpu.fused_experts(x, want13, want2, tw, ids))


@pytest.mark.isa
def test_qwen2_moe_f32_shared_expert(tmp_path, rng):
    """F32 checkpoint -> bf16 by rounding; Qwen2-MoE shared_expert + shared_expert_gate."""
    E, H, I, Is = 4, 64, 32, 48
    tensors = {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "gate.weight"] = float_weights(rng, 1, E, H)[0]
        tensors[pre + "shared_expert_gate.weight"] = float_weights(rng, 1, 1, H)[0]
        for e in range(E):
            for p, (N, K) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                tensors[f"{pre}experts.{e}.{p}.weight"] = float_weights(rng, 1, N, K)[0]
        for p, (N, K) in (("gate_proj", (Is, H)), ("up_proj", (Is, H)), ("down_proj", (H, Is))):
            tensors[f"{pre}shared_expert.{p}.weight"] = float_weights(rng, 1, N, K)[0]
    cfg = qwen3_config(E, H, I, model_type="qwen2_moe", norm_topk_prob=False, shared_expert_intermediate_size=Is)
    lw = load_layer(save_hf(tmp_path / "q2", cfg, tensors), L)
    pre = f"model.layers.{L}.mlp."
    t = lambda n: tensors[pre + n]  # noqa: E731
    sw13 = np.concatenate([t("shared_expert.gate_proj.weight"), t("shared_expert.up_proj.weight")])[None]
    assert lw.scheme == "bf16" and lw.shared_w13.scheme == "bf16" and not lw.config.renormalize
    assert_codes(lw.shared_w13, weight=ref.float_to_bf16_bits(sw13))
    assert_codes(lw.w2, weight=ref.float_to_bf16_bits(np.stack([t(f"experts.{e}.down_proj.weight") for e in range(E)])))
    np.testing.assert_array_equal(lw.shared_expert_gate, t("shared_expert_gate.weight")[0])
    assert lw.config.shared_intermediate_size == Is
    # The layer: routed + sigmoid(x @ shared_expert_gate) * SiLU-FFN_shared(x), against float64 NumPy.
    layer = moe_cpu.MoELayer.from_weights(lw)
    assert "sigmoid-gated" in repr(layer)
    x = make_input(rng, 9, H)
    x64 = x.astype(np.float64)
    w64 = lambda a: ref.bf16_round(a).astype(np.float64)  # noqa: E731
    logits = (x64 @ t("gate.weight").T.astype(np.float64)).astype(np.float32)
    tw, ids = ref.select_experts_ref(logits, 2)
    want = np.zeros((9, H))
    for m in range(9):
        for j in range(2):
            e = ids[m, j]
            g = x64[m] @ w64(t(f"experts.{e}.gate_proj.weight")).T
            u = x64[m] @ w64(t(f"experts.{e}.up_proj.weight")).T
            want[m] += tw[m, j] * ((g / (1 + np.exp(-g)) * u) @ w64(t(f"experts.{e}.down_proj.weight")).T)
    g, u = x64 @ w64(t("shared_expert.gate_proj.weight")).T, x64 @ w64(t("shared_expert.up_proj.weight")).T
    shared = (g / (1 + np.exp(-g)) * u) @ w64(t("shared_expert.down_proj.weight")).T
    want += shared / (1 + np.exp(-(x64 @ t("shared_expert_gate.weight")[0].astype(np.float64))))[:, None]
    assert_close(layer(x), want, "bf16", "Qwen2-MoE layer with its shared-expert gate")
    assert_close(layer.reference(x), want, "bf16", "MoELayer.reference with the gate")
    # saved and loaded with the layer (layer.json version 2)
    layer.save(tmp_path / "saved")
    back = moe_cpu.MoELayer.load(tmp_path / "saved")
    np.testing.assert_array_equal(back.shared_expert_gate, lw.shared_expert_gate)
    np.testing.assert_array_equal(back(x), layer(x))


@pytest.mark.isa
@pytest.mark.parametrize("raw", [False, True])
def test_gpt_oss_bf16_fused_interleaved(tmp_path, rng, monkeypatch, raw):
    """gpt-oss: gate_up_proj [E, H, 2I] (interleaved gate/up columns), biases, router bias.
    raw: read BF16 through the file layout, as without ml_dtypes."""
    raw_reads = []
    if raw:
        monkeypatch.setattr(safetensors_loader, "_HAVE_ML_DTYPES", False)
        real_raw = safetensors_loader._Checkpoint._raw
        monkeypatch.setattr(safetensors_loader._Checkpoint, "_raw",
                            lambda self, name, *a: raw_reads.append(name) or real_raw(self, name, *a))
    E, H, I = 4, 64, 45
    tensors = {}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "router.weight"] = bf16(float_weights(rng, 1, E, H)[0])
        tensors[pre + "router.bias"] = bf16(rng.standard_normal(E).astype(np.float32))
        tensors[pre + "experts.gate_up_proj"] = bf16(float_weights(rng, E, H, 2 * I))
        tensors[pre + "experts.gate_up_proj_bias"] = bf16(rng.standard_normal((E, 2 * I)).astype(np.float32) * 0.1)
        tensors[pre + "experts.down_proj"] = bf16(float_weights(rng, E, I, H))
        tensors[pre + "experts.down_proj_bias"] = bf16(rng.standard_normal((E, H)).astype(np.float32) * 0.1)
    cfg = {"model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I, "num_local_experts": E,
           "num_experts_per_tok": 2, "experts_per_token": 2, "swiglu_limit": 7.0, "num_hidden_layers": LAYERS}
    lw = load_layer(save_hf(tmp_path / "oss", cfg, tensors), L)
    assert bool(raw_reads) == raw
    t = lambda n: tensors[f"model.layers.{L}.mlp." + n]  # noqa: E731
    bits13 = t("experts.gate_up_proj").view(np.uint16).transpose(0, 2, 1)
    assert lw.scheme == "bf16" and lw.config.activation == "swigluoai" and lw.config.renormalize
    assert_codes(lw.w13, weight=bits13)
    assert_codes(lw.w2, weight=t("experts.down_proj").view(np.uint16).transpose(0, 2, 1))
    np.testing.assert_array_equal(lw.w13_bias, t("experts.gate_up_proj_bias").astype(np.float32))
    np.testing.assert_array_equal(lw.gate_bias, t("router.bias").astype(np.float32))
    w13r = ref.RefWeights.bf16(np.ascontiguousarray(bits13))
    w2r = ref.RefWeights.bf16(np.ascontiguousarray(t("experts.down_proj").view(np.uint16).transpose(0, 2, 1)))
    check_moe(rng, lw, w13r, w2r)
    # The whole layer, router bias included: logits = x @ gate.T + bias, then the experts.
    layer = moe_cpu.MoELayer.from_weights(lw)
    x = make_input(rng, 10, H)
    logits = (x.astype(np.float64) @ lw.gate.T.astype(np.float64) + lw.gate_bias).astype(np.float32)
    tw, ids = ref.select_experts_ref(logits, 2, renormalize=True)
    want = ref.fused_experts_ref(x, w13r, w2r, tw, ids, activation="swigluoai", w13_bias=lw.w13_bias, w2_bias=lw.w2_bias)
    assert_close(layer(x), want, "bf16", "gpt-oss layer with router bias")


# ----------------------------------------------------------------------------------- GGUF
def q4_0_bytes(q, d):
    """Q4_0 blocks: fp16 d, then byte j = (q[j] + 8) | (q[j + 16] + 8) << 4 (ggml block_q4_0)."""
    nib = (q.reshape(*q.shape[:-1], -1, 32) + 8).astype(np.uint8)
    qs = nib[..., :16] | (nib[..., 16:] << 4)
    return np.concatenate([d[..., None].view(np.uint8), qs], axis=-1).reshape(*q.shape[:-1], -1)


def q8_0_bytes(q, d):
    """Q8_0 blocks: fp16 d, then 32 int8 codes."""
    return np.concatenate([d[..., None].view(np.uint8), q.reshape(*q.shape[:-1], -1, 32).view(np.uint8)],
                          axis=-1).reshape(*q.shape[:-1], -1)


def gguf_tensor(rng, typ, shape):
    """(array to write, raw_dtype, expected): expected = (codes, scales) or float32 values."""
    K = shape[-1]
    if typ in ("Q4_0", "Q8_0"):
        lim = 8 if typ == "Q4_0" else 128
        q = rng.integers(-lim, lim, shape).astype(np.int8)
        sign = np.where(rng.random((*shape[:-1], K // 32)) < 0.5, -1, 1)    # Q4_0's d is often negative
        d = (sign * rng.uniform(0.5, 1.5, sign.shape) / (lim * np.sqrt(K))).astype(np.float16)
        data = q4_0_bytes(q, d) if typ == "Q4_0" else q8_0_bytes(q, d)
        return data, T[typ], (q, d.astype(np.float32))
    w = float_weights(rng, 1, int(np.prod(shape[:-1])), K).reshape(shape)
    if typ == "BF16":
        return ref.float_to_bf16_bits(w).view(np.uint8).reshape(*shape[:-1], -1), T.BF16, ref.bf16_round(w)
    if typ == "F16":
        return w.astype(np.float16), None, w.astype(np.float16).astype(np.float32)
    return w, None, w


def write_gguf(path, arch, meta, tensors):
    """meta: key -> value (uint32 / float32 / bool); tensors: name -> (array, raw_dtype)."""
    wr = gguf.GGUFWriter(str(path), arch)
    for key, v in meta.items():
        if isinstance(v, bool):
            wr.add_bool(key, v)
        elif isinstance(v, float):
            wr.add_float32(key, v)
        else:
            wr.add_uint32(key, v)
    for name, (a, raw) in tensors.items():
        wr.add_tensor(name, a, raw_dtype=raw)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def gguf_moe(rng, arch, E, H, I, types, shexp=None, extra=None, fused=False):
    """Tensors for LAYERS layers; returns (tensors, expected of layer L by short name)."""
    tensors, keep = {}, {}
    for layer in range(LAYERS):
        p = f"blk.{layer}."
        specs = [("ffn_gate_inp.weight", "F32", (E, H))]
        if fused:
            specs += [("ffn_gate_up_exps.weight", types[0], (E, 2 * I, H))]
        else:
            specs += [("ffn_gate_exps.weight", types[0], (E, I, H)), ("ffn_up_exps.weight", types[1], (E, I, H))]
        specs += [("ffn_down_exps.weight", types[2], (E, H, I))]
        if shexp:
            specs += [(f"ffn_{n}_shexp.weight", types[0], s) for n, s in
                      (("gate", (shexp, H)), ("up", (shexp, H)), ("down", (H, shexp)))]
        specs += [(n, "F32", s) for n, s in (extra or {}).items()]
        for name, typ, shape in specs:
            a, raw, exp = gguf_tensor(rng, typ, shape)
            tensors[p + name] = (a, raw)
            if layer == L:
                keep[name] = exp
    return tensors, keep


def gguf_meta(arch, E, H, I, **kw):
    return {f"{arch}.block_count": LAYERS, f"{arch}.expert_count": E, f"{arch}.expert_used_count": 2,
            f"{arch}.embedding_length": H, f"{arch}.expert_feed_forward_length": I, **kw}


def ref_weights(exps, scheme):
    """RefWeights from expected GGUF parts stacked along rows ([E, n, K] each)."""
    if scheme == "bf16":
        return ref.RefWeights.bf16(ref.float_to_bf16_bits(np.concatenate(exps, axis=1)))
    q = np.concatenate([e[0] for e in exps], axis=1)
    s = np.concatenate([e[1] for e in exps], axis=1)
    # GGUF Q4_0 / Q8_0 run with ggml's Q8_0 activation blocks of 32 (load_layer's act_block="auto")
    return (ref.RefWeights.int4 if scheme == "int4_w4a8" else ref.RefWeights.int8)(q, s, 32, act_block=32)


@pytest.mark.isa
@pytest.mark.parametrize("types,scheme", [
    (("Q4_0",) * 3, "int4_w4a8"), (("Q8_0",) * 3, "int8_w8a8"), (("Q4_0", "Q4_0", "Q8_0"), "int4_w4a8/int8_w8a8"),
    (("BF16",) * 3, "bf16"), (("F16",) * 3, "bf16"), (("F32",) * 3, "bf16")])
def test_gguf_qwen3moe(tmp_path, rng, types, scheme):
    E, H = 4, 128
    I = 64 if types[0].startswith("Q") else 45
    tensors, keep = gguf_moe(rng, "qwen3moe", E, H, I, types)
    path = write_gguf(tmp_path / "m.gguf", "qwen3moe", gguf_meta("qwen3moe", E, H, I), tensors)
    lw = load_layer(path, L)
    s13, s2 = (scheme.split("/") * 2)[:2]          # w13 and w2 keep their own int forms
    assert (lw.w13.scheme, lw.w2.scheme) == (s13, s2) and lw.config.renormalize and lw.config.top_k == 2
    w13r = ref_weights([keep["ffn_gate_exps.weight"], keep["ffn_up_exps.weight"]], s13)
    w2r = ref_weights([keep["ffn_down_exps.weight"]], s2)
    if scheme == "bf16":
        assert_codes(lw.w13, weight=w13r.codes)
        assert_codes(lw.w2, weight=w2r.codes)
    else:
        assert lw.w13.group_size == lw.w2.group_size == 32
        assert lw.w13.act_block == lw.w2.act_block == 32 and "activation blocks of 32" in repr(moe_cpu.MoELayer.from_weights(lw))
        assert_codes(lw.w13, qweight=w13r.codes, scales=w13r.scales)
        assert_codes(lw.w2, qweight=w2r.codes, scales=w2r.scales)
        # our reading of the blocks agrees with gguf's own dequantizer
        raw, typ = tensors[f"blk.{L}.ffn_gate_exps.weight"]
        np.testing.assert_array_equal(lw.w13.unpack()[:, :I], gguf.quants.dequantize(raw, typ).reshape(E, I, H))
    np.testing.assert_array_equal(lw.gate, keep["ffn_gate_inp.weight"])
    check_moe(rng, lw, w13r, w2r)


@pytest.mark.isa
def test_gguf_deepseek2_shared_and_routing(tmp_path, rng):
    E, H, I, Is = 8, 64, 32, 64
    tensors, keep = gguf_moe(rng, "deepseek2", E, H, I, ("Q8_0",) * 3, shexp=Is, extra={"exp_probs_b.bias": (E,)})
    meta = gguf_meta("deepseek2", E, H, I, **{"deepseek2.expert_gating_func": 2, "deepseek2.expert_weights_norm": True,
                                              "deepseek2.expert_weights_scale": 2.5, "deepseek2.expert_shared_count": 1,
                                              "deepseek2.expert_group_count": 4, "deepseek2.expert_group_used_count": 2,
                                              "deepseek2.leading_dense_block_count": 1})
    lw = load_layer(write_gguf(tmp_path / "ds.gguf", "deepseek2", meta, tensors), L)
    c = lw.config
    assert (c.scoring_func, c.renormalize, c.routed_scaling_factor, c.use_grouped_topk, c.num_expert_group,
            c.topk_group, c.shared_intermediate_size) == ("sigmoid", True, 2.5, True, 4, 2, Is)
    np.testing.assert_array_equal(lw.e_score_correction_bias, keep["exp_probs_b.bias"])
    one = lambda n: tuple(a[None] for a in keep[n])  # noqa: E731   (codes, scales) as one expert
    s13 = ref_weights([one("ffn_gate_shexp.weight"), one("ffn_up_shexp.weight")], "int8_w8a8")
    assert lw.shared_w13.scheme == "int8_w8a8"
    assert_codes(lw.shared_w13, qweight=s13.codes, scales=s13.scales)
    x = make_input(rng, 8, H)
    got = moe_cpu.shared_expert(x, lw.shared_w13, lw.shared_w2, np.zeros_like(x))
    want = ref.shared_expert_ref(x, s13, ref_weights([one("ffn_down_shexp.weight")], "int8_w8a8"), np.zeros_like(x))
    assert_close(got, want, "int8_w8a8", "gguf shared expert")


@pytest.mark.isa
@pytest.mark.parametrize("fused", [False, True])
def test_gguf_gpt_oss_biases(tmp_path, rng, fused):
    E, H, I = 4, 64, 32
    extra = {"ffn_gate_inp.bias": (E,), "ffn_down_exps.bias": (E, H)}
    extra.update({"ffn_gate_up_exps.bias": (E, 2 * I)} if fused else
                 {"ffn_gate_exps.bias": (E, I), "ffn_up_exps.bias": (E, I)})
    tensors, keep = gguf_moe(rng, "gpt-oss", E, H, I, ("BF16",) * 3, extra=extra, fused=fused)
    lw = load_layer(write_gguf(tmp_path / "oss.gguf", "gpt-oss", gguf_meta("gpt-oss", E, H, I), tensors), L)
    assert lw.config.activation == "swigluoai_uninterleave" and lw.config.renormalize
    parts = [keep["ffn_gate_up_exps.weight"]] if fused else [keep["ffn_gate_exps.weight"], keep["ffn_up_exps.weight"]]
    w13r = ref_weights(parts, "bf16")
    assert_codes(lw.w13, weight=w13r.codes)
    b13 = keep["ffn_gate_up_exps.bias"] if fused else \
        np.concatenate([keep["ffn_gate_exps.bias"], keep["ffn_up_exps.bias"]], axis=1)
    np.testing.assert_array_equal(lw.w13_bias, b13)
    np.testing.assert_array_equal(lw.gate_bias, keep["ffn_gate_inp.bias"])
    check_moe(rng, lw, w13r, ref_weights([keep["ffn_down_exps.weight"]], "bf16"))


# ------------------------------------------------------------------------------ bad inputs
def _bad(tmp_path, label):
    """Write a broken checkpoint; return (path, scheme) to load layer L from."""
    rng = np.random.default_rng(0)
    E, H, I = 4, 64, 32
    if label.startswith("gguf"):
        H = 256 if label == "gguf_q8_1" else H
        tensors, _ = gguf_moe(rng, "qwen3moe", E, H, I, ("F16",) * 3)
        meta = gguf_meta("qwen3moe", E, H, I)
        if label == "gguf_q8_1":        # Q8_1 (ggml's activation type, 40-byte blocks of 32): not an expert type
            tensors[f"blk.{L}.ffn_up_exps.weight"] = (np.zeros((E, I, 8 * 40), np.uint8), T.Q8_1)
        elif label == "gguf_missing_key":
            del meta["qwen3moe.expert_used_count"]
        elif label == "gguf_wrong_shape":
            tensors[f"blk.{L}.ffn_down_exps.weight"] = (np.zeros((E - 1, H, I), np.float16), None)
        elif label == "gguf_missing_tensor":
            del tensors[f"blk.{L}.ffn_gate_exps.weight"]
        elif label == "gguf_truncated":
            path = write_gguf(tmp_path / "t.gguf", "qwen3moe", meta, tensors)
            path.write_bytes(path.read_bytes()[:1000])
            return path, None
        return write_gguf(tmp_path / "bad.gguf", "qwen3moe", meta, tensors), None
    if label == "unknown_format":
        (tmp_path / "w.bin").write_bytes(b"\x00" * 64)
        return tmp_path / "w.bin", None
    tensors, cfg, scheme = {}, qwen3_config(E, H, I), None
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "gate.weight"] = float_weights(rng, 1, E, H)[0]
        for e in range(E):
            for p, (N, K) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                m = f"{pre}experts.{e}.{p}."
                if label == "st_int4_range":
                    q = rng.integers(-8, 8, (N, K)).astype(np.int8)
                    q[1, 2] = 9 if (layer, e, p) == (L, 2, "down_proj") else q[1, 2]
                    tensors[m + "weight"], tensors[m + "weight_scale"] = q, np.ones((N, 1), np.float32)
                    cfg["quantization_config"] = ct_config(4, -1, "int-quantized")
                elif label in ("st_scale_dtype", "st_requantize"):
                    q, s = ref.quantize_int4(float_weights(rng, 1, N, K), 32)
                    tensors[m + "weight_packed"] = pack_int32(q[0])
                    tensors[m + "weight_shape"] = np.array([N, K], np.int64)
                    tensors[m + "weight_scale"] = s[0].astype(np.int32) if label == "st_scale_dtype" else bf16(s[0])
                    cfg["quantization_config"] = ct_config(4, 32, "pack-quantized")
                else:
                    tensors[m + "weight"] = float_weights(rng, 1, N, K)[0]
    x = f"model.layers.{L}.mlp.experts."
    if label == "st_missing_expert":
        del tensors[x + "2.up_proj.weight"]
    elif label == "st_wrong_shape":
        tensors[x + "1.down_proj.weight"] = np.zeros((H, I + 1), np.float32)
    elif label == "st_wrong_dtype":
        tensors[x + "3.gate_proj.weight"] = np.zeros((I, H), np.int32)
    elif label == "st_missing_key":
        del cfg["num_experts_per_tok"]
    elif label == "st_config_experts_huge":   # read before allocating: not a MemoryError for 10^12 experts
        cfg["num_experts"] = 10**12
    elif label == "st_config_inter_huge":
        cfg["moe_intermediate_size"] = 10**12
    elif label == "st_unknown_model":
        cfg["model_type"] = "llama"
    elif label == "st_dense_layer":
        cfg = {**cfg, "model_type": "deepseek_v3", "n_routed_experts": E, "n_group": 1, "topk_group": 1,
               "first_k_dense_replace": 2}
    elif label == "st_requantize":
        scheme = "bf16"
    path = save_hf(tmp_path / "ckpt", cfg, tensors)
    if label == "st_no_config":
        (path / "config.json").unlink()
    return path, scheme


BAD = [  # label, substrings the ValueError message must contain
    ("st_missing_expert", ["missing tensor", "experts.2.up_proj.weight"]),
    ("st_wrong_shape", ["experts.1.down_proj.weight", "shape [64, 33]", "[64, 32] was expected"]),
    ("st_wrong_dtype", ["experts.3.gate_proj.weight", "dtype I32"]),
    ("st_scale_dtype", ["experts.0.gate_proj.weight_scale", "dtype I32"]),
    ("st_int4_range", ["experts.2.down_proj.weight", "[-8, 7]", "9"]),
    ("st_missing_key", ["'num_experts_per_tok'", "missing"]),
    ("st_config_experts_huge", ["missing tensor", "experts.999999999999.gate_proj.weight"]),
    ("st_config_inter_huge", ["experts.0.gate_proj.weight", "shape [32, 64]", "[1000000000000, 64] was expected"]),
    ("st_unknown_model", ["model_type = 'llama'"]),
    ("st_dense_layer", ["layer 1", "dense", "first_k_dense_replace"]),
    ("st_no_config", ["config.json"]),
    ("st_requantize", ["already quantized", "scheme='bf16'"]),
    ("unknown_format", ["unknown checkpoint format"]),
    ("gguf_q8_1", ["unsupported GGUF type Q8_1 for tensor blk.1.ffn_up_exps.weight", "Q2_K", "IQ1_M"]),
    ("gguf_missing_key", ["'qwen3moe.expert_used_count'", "missing"]),
    ("gguf_wrong_shape", ["blk.1.ffn_down_exps.weight", "shape"]),
    ("gguf_missing_tensor", ["missing tensor blk.1.ffn_gate_exps.weight"]),
    ("gguf_truncated", ["t.gguf"]),
]


def assert_load_raises(tmp_path, path, scheme, label, needles):
    """load_layer(path, L, scheme) in a subprocess must raise ValueError with every needle in its message."""
    code = textwrap.dedent(f"""
        from moe_cpu.loaders import load_layer
        try:
            load_layer({str(path)!r}, {L}, {scheme!r})
        except Exception as e:
            print("RAISED", type(e).__name__, str(e), sep="\\t")
        else:
            print("NO-ERROR")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, f"{label}: crashed with code {proc.returncode}\n{proc.stderr[-2000:]}"
    out = proc.stdout.strip().splitlines()[-1]
    assert out.startswith("RAISED"), f"{label}: no exception raised"
    _, name, message = out.split("\t", 2)
    assert name == "ValueError", f"{label}: raised {name}: {message}"
    for needle in needles:
        assert needle in message, f"{label}: message {message!r} lacks {needle!r}"


@pytest.mark.parametrize("label,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_checkpoint_raises_clear_error(tmp_path, label, needles):
    path, scheme = _bad(tmp_path, label)
    assert_load_raises(tmp_path, path, scheme, label, needles)


def test_bad_arguments():
    with pytest.raises(ValueError, match="scheme"):
        load_layer("x.gguf", 0, "int3")
    with pytest.raises(ValueError, match="layer_idx"):
        load_layer("x.gguf", -1)
    with pytest.raises(ValueError, match="no such file"):
        load_layer("/nonexistent/x.gguf", 0)
