"""Tests of moe_cpu.vllm_compat: vLLM names and values, capability checks, and CPUExpertsInt4.apply.

The expected enum values are literals read from vLLM's source
(vllm/model_executor/layers/fused_moe/config.py, .../fused_moe/activation.py and
.../quantization/utils/quant_utils.py); see docs/vllm_compat.md.
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import moe_cpu
from moe_cpu import reference
from moe_cpu import vllm_compat as vc
from moe_cpu.vllm_compat import (
    CPUExpertsInt4,
    FusedMoEActivationFormat,
    FusedMoEConfig,
    FusedMoEParallelConfig,
    FusedMoEQuantConfig,
    GroupShape,
    MoEActivation,
    QuantKey,
    RoutingMethodType,
    ScaleDesc,
    kInt4W4A8StaticChannelSym,
    kInt4W4A8StaticGroup32Sym,
    kInt4W4A8StaticGroup64Sym,
    kInt4W4A8StaticGroup128Sym,
    kInt4W4A8StaticGroupSym,
    make_w4a8_int8_moe_quant_config,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
STANDARD = FusedMoEActivationFormat.Standard

# Relative L2 error of the int4/int8 path against float64 math on the *dequantized* weights:
# only the per-row int8 activation quantization (twice) remains, about 1%.
TOL_DEQUANT_REL_L2 = 4e-2
# ... and against the original float weights: int4 weights add about 10% per GEMM.
TOL_UNQUANT_REL_L2 = 0.3
# Two expert-parallel halves summed vs the whole layer: the same products, fp32 sums regrouped.
TOL_EP_RTOL = 1e-5


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ----------------------------------------------------------------------------------------------
# Enums: names and values as in vLLM
# ----------------------------------------------------------------------------------------------
def test_routing_method_type_values_match_vllm():
    expected = {
        "Default": 0,
        "Renormalize": 1,
        "DeepSeekV3": 2,
        "Llama4": 3,
        "RenormalizeNaive": 4,
        "TopK": 5,
        "SigmoidRenorm": 6,
        "MiniMax2": 7,
        "Sigmoid": 8,
        "Unspecified": 9,
        "DeepseekV4": 100,
        "Custom": 101,
        "Simulated": 102,
    }
    assert {m.name: int(m) for m in RoutingMethodType} == expected
    assert RoutingMethodType(4) is RoutingMethodType.RenormalizeNaive
    assert RoutingMethodType.Renormalize == 1  # IntEnum, as in vLLM


def test_moe_activation_values_match_vllm():
    expected = {
        "SILU": "silu",
        "GELU": "gelu",
        "GELU_TANH": "gelu_tanh",
        "RELU2": "relu2",
        "SWIGLUOAI": "swigluoai",
        "SITU": "situ",
        "SWIGLUOAI_UNINTERLEAVE": "swigluoai_uninterleave",
        "SWIGLUSTEP": "swiglustep",
        "SILU_NO_MUL": "silu_no_mul",
        "GELU_NO_MUL": "gelu_no_mul",
        "GELU_TANH_NO_MUL": "gelu_tanh_no_mul",
        "RELU2_NO_MUL": "relu2_no_mul",
    }
    assert {m.name: m.value for m in MoEActivation} == expected


def test_moe_activation_helpers():
    assert MoEActivation.SILU.is_gated and not MoEActivation.SILU_NO_MUL.is_gated
    assert MoEActivation.SILU.without_mul() is MoEActivation.SILU_NO_MUL
    assert MoEActivation.GELU_TANH.without_mul() is MoEActivation.GELU_TANH_NO_MUL
    assert MoEActivation.SWIGLUOAI.without_mul() is MoEActivation.SWIGLUOAI
    assert MoEActivation.from_str("swiglustep") is MoEActivation.SWIGLUSTEP
    assert MoEActivation.from_str("gelu_pytorch_tanh") is MoEActivation.GELU_TANH
    with pytest.raises(ValueError, match="unknown MoE activation 'swish'"):
        MoEActivation.from_str("swish")


@pytest.mark.parametrize(
    "act, name",
    [
        (MoEActivation.SILU, "silu"),
        (MoEActivation.GELU, "gelu"),
        (MoEActivation.GELU_TANH, "gelu_tanh"),
        (MoEActivation.SWIGLUSTEP, "swiglustep"),
        (MoEActivation.SWIGLUOAI, "swigluoai"),
        (MoEActivation.SWIGLUOAI_UNINTERLEAVE, "swigluoai_uninterleave"),
    ],
)
def test_activation_maps_to_moe_cpu_names(act, name):
    assert act.moe_cpu_name == name
    assert vc.to_moe_cpu_activation(act) == name
    assert vc.to_moe_cpu_activation(act.value) == name
    assert name in moe_cpu.ACTIVATIONS


@pytest.mark.parametrize(
    "act", [MoEActivation.RELU2, MoEActivation.SITU, MoEActivation.SILU_NO_MUL, MoEActivation.RELU2_NO_MUL]
)
def test_activation_without_moe_cpu_kernel_raises(act):
    with pytest.raises(ValueError, match="has no moe_cpu kernel"):
        vc.to_moe_cpu_activation(act)
    with pytest.raises(ValueError, match="has no moe_cpu kernel"):
        act.moe_cpu_name


def test_activation_format_members():
    assert [m.name for m in FusedMoEActivationFormat] == ["Standard", "BatchedExperts"]
    assert CPUExpertsInt4.activation_format() is FusedMoEActivationFormat.Standard


# ----------------------------------------------------------------------------------------------
# GroupShape, ScaleDesc, QuantKey
# ----------------------------------------------------------------------------------------------
def test_group_shape_constants_and_predicates():
    assert GroupShape.PER_TENSOR == (-1, -1) and GroupShape.PER_TENSOR.is_per_tensor()
    assert GroupShape.PER_TOKEN == (1, -1) and GroupShape.PER_TOKEN.is_per_token()
    assert GroupShape.PER_CHANNEL == (-1, 1) and GroupShape.PER_CHANNEL.is_per_channel()
    g = GroupShape(1, 32)
    assert g.is_per_group() and not g.is_per_token() and (g.row, g.col) == (1, 32)
    assert not GroupShape.PER_TOKEN.is_per_group()
    assert hash(GroupShape(1, 32)) == hash((1, 32))


def test_int4_w4a8_keys_match_vllm_definitions():
    # vLLM: QuantKey(torch.int8, ScaleDesc(torch.bfloat16, True, GroupShape(1, g)), symmetric=True)
    for key, g in ((kInt4W4A8StaticGroup32Sym, 32), (kInt4W4A8StaticGroup64Sym, 64),
                   (kInt4W4A8StaticGroup128Sym, 128), (kInt4W4A8StaticGroupSym, -1)):
        assert key.dtype == np.dtype(np.int8)
        assert key.scale == ScaleDesc(BF16, True, GroupShape(1, g))
        assert key.scale2 is None and key.symmetric
    # vLLM: QuantKey(torch.int8, ScaleDesc(torch.float32, True, GroupShape.PER_CHANNEL), symmetric=True)
    assert kInt4W4A8StaticChannelSym == QuantKey(np.int8, ScaleDesc(np.float32, True, GroupShape(-1, 1)))
    assert kInt4W4A8StaticGroupSym.scale.group_shape == GroupShape.PER_TOKEN


def test_quant_key_equality_and_hash_across_dtype_spellings():
    spellings = [
        QuantKey(np.int8, ScaleDesc("bfloat16", True, GroupShape(1, 32))),
        QuantKey("int8", ScaleDesc(ml_dtypes.bfloat16, True, (1, 32))),
        QuantKey(np.dtype("int8"), ScaleDesc("bf16", True, [1, 32]), None, True),
    ]
    for k in spellings:
        assert k == kInt4W4A8StaticGroup32Sym
        assert hash(k) == hash(kInt4W4A8StaticGroup32Sym)
    assert len({*spellings, kInt4W4A8StaticGroup32Sym}) == 1
    table = {kInt4W4A8StaticGroup32Sym: "g32"}
    assert table[spellings[1]] == "g32"
    assert isinstance(spellings[1].scale.group_shape, GroupShape)


@pytest.mark.parametrize(
    "other",
    [
        QuantKey(np.int8, ScaleDesc(np.float32, True, GroupShape(1, 32))),    # scale dtype
        QuantKey(np.int8, ScaleDesc("bfloat16", False, GroupShape(1, 32))),   # dynamic
        QuantKey(np.int8, ScaleDesc("bfloat16", True, GroupShape(1, 64))),    # group
        QuantKey(np.uint8, ScaleDesc("bfloat16", True, GroupShape(1, 32))),   # dtype
        QuantKey(np.int8, ScaleDesc("bfloat16", True, GroupShape(1, 32)), symmetric=False),
        QuantKey(np.int8, ScaleDesc("bfloat16", True, GroupShape(1, 32)),
                 scale2=ScaleDesc(np.float32, True, GroupShape.PER_TENSOR)),
    ],
)
def test_quant_key_inequality(other):
    assert other != kInt4W4A8StaticGroup32Sym


def test_quant_key_is_frozen_and_prints_compactly():
    with pytest.raises(dataclasses.FrozenInstanceError):
        kInt4W4A8StaticGroup32Sym.symmetric = False  # type: ignore[misc]
    assert str(kInt4W4A8StaticGroup32Sym) == "QuantKey(i8,scale(bf16,static,(1, 32)),symmetric)"
    assert str(kInt4W4A8StaticChannelSym) == "QuantKey(i8,scale(f32,static,per_channel),symmetric)"


def test_quant_key_rejects_bad_fields():
    with pytest.raises(TypeError, match="scale must be a ScaleDesc"):
        QuantKey(np.int8, (1, 32))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown dtype name"):
        ScaleDesc("not_a_dtype", True, GroupShape(1, 32))


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------
def test_parallel_config_no_parallel():
    p = FusedMoEParallelConfig.make_no_parallel()
    assert (p.tp_size, p.dp_size, p.ep_size, p.pcp_size, p.sp_size) == (1, 1, 1, 1, 1)
    assert (p.tp_rank, p.dp_rank, p.ep_rank, p.pcp_rank) == (0, 0, 0, 0)
    assert not p.use_ep and not p.enable_eplb and not p.is_sequence_parallel


def test_moe_config_derived_fields():
    cfg = FusedMoEConfig(16, 4, 128, 256, moe_parallel_config=FusedMoEParallelConfig(tp_size=2, tp_rank=1))
    assert cfg.intermediate_size_per_partition == 128
    assert cfg.num_local_experts == 16 and cfg.tp_size == 2 and cfg.tp_rank == 1
    assert cfg.router_logits_dtype == np.dtype(np.float32)
    ep = FusedMoEConfig(16, 4, 128, 256, moe_parallel_config=FusedMoEParallelConfig(ep_size=4, ep_rank=3, use_ep=True))
    assert ep.num_local_experts == 4 and ep.ep_size == 4 and ep.ep_rank == 3 and ep.use_ep
    s = FusedMoEConfig(8, 2, 64, 64, activation="swigluoai", routing_method=1, in_dtype="bfloat16")
    assert s.activation is MoEActivation.SWIGLUOAI and s.routing_method is RoutingMethodType.Renormalize
    assert s.in_dtype == BF16 and s.router_logits_dtype == BF16 and s.is_act_and_mul


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(intermediate_size=100, moe_parallel_config=FusedMoEParallelConfig(tp_size=3)), "divisible by"),
        (dict(experts_per_token=9), "exceeds num_experts"),
        (dict(hidden_dim=0), "hidden_dim must be a positive integer"),
        (dict(routing_method=55), "not a RoutingMethodType"),
        (dict(moe_parallel_config=FusedMoEParallelConfig(ep_size=3, use_ep=True)), "pass num_local_experts"),
        (dict(intermediate_size_per_partition=7), "leave it unset"),
    ],
)
def test_moe_config_rejects_inconsistent_sizes(kwargs, match):
    base = dict(num_experts=8, experts_per_token=2, hidden_dim=64, intermediate_size=64)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        FusedMoEConfig(**base)


def test_quant_config_group_size_and_keys():
    assert make_w4a8_int8_moe_quant_config((1, 32)).weight_key == kInt4W4A8StaticGroup32Sym
    assert make_w4a8_int8_moe_quant_config((1, 64)).weight_key == kInt4W4A8StaticGroup64Sym
    assert make_w4a8_int8_moe_quant_config([1, 128]).weight_key == kInt4W4A8StaticGroup128Sym
    for bs in (None, (-1, 1)):
        q = make_w4a8_int8_moe_quant_config(bs)
        assert q.weight_key == kInt4W4A8StaticChannelSym and q.group_size == -1 and q.block_shape == [-1, 1]
    q = make_w4a8_int8_moe_quant_config((1, 64))
    assert q.group_size == 64 and q.block_shape == [1, 64] and q.activation_key is None
    assert not q.is_quantized and q.is_block_quantized and not q.is_per_act_token
    assert q.weight_quant_dtype == np.dtype(np.int8) and q.quant_dtype is None
    assert FusedMoEQuantConfig(per_act_token_quant=True).group_size == -1
    assert FusedMoEQuantConfig(block_shape=[1, 256]).group_size == 256
    with pytest.raises(ValueError, match="per_act_token_quant cannot be combined"):
        FusedMoEQuantConfig(block_shape=[1, 32], per_act_token_quant=True)
    with pytest.raises(ValueError, match="block_shape must be a"):
        FusedMoEQuantConfig(block_shape=[32])


# ----------------------------------------------------------------------------------------------
# Capability checks
# ----------------------------------------------------------------------------------------------
def test_device_and_act_and_mul_checks():
    assert CPUExpertsInt4._supports_current_device() is True
    assert CPUExpertsInt4._supports_no_act_and_mul() is False


@pytest.mark.parametrize("act", list(MoEActivation))
def test_supports_activation(act):
    expected = act in (MoEActivation.SILU, MoEActivation.SWIGLUOAI, MoEActivation.SWIGLUSTEP)
    assert CPUExpertsInt4._supports_activation(act) is expected


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (FusedMoEParallelConfig.make_no_parallel(), True),
        (FusedMoEParallelConfig(ep_size=2, ep_rank=1, use_ep=True), True),       # EP via expert_map
        (FusedMoEParallelConfig(ep_size=8, ep_rank=7, dp_size=2, dp_rank=1, use_ep=True), True),
        (FusedMoEParallelConfig(tp_size=4, tp_rank=3), True),
        (FusedMoEParallelConfig(sp_size=2), True),
        (FusedMoEParallelConfig(ep_size=2, ep_rank=2, use_ep=True), False),      # rank out of range
        (FusedMoEParallelConfig(tp_size=0), False),
        (FusedMoEParallelConfig(ep_size=2, use_ep=False), False),                # inconsistent
        (FusedMoEParallelConfig(ep_size=2, use_ep=True, enable_eplb=True), False),
    ],
)
def test_supports_parallel_config(cfg, expected):
    assert CPUExpertsInt4._supports_parallel_config(cfg) is expected


@pytest.mark.parametrize(
    "wkey", [kInt4W4A8StaticGroup32Sym, kInt4W4A8StaticGroup64Sym, kInt4W4A8StaticGroup128Sym,
             kInt4W4A8StaticGroupSym, kInt4W4A8StaticChannelSym],
)
def test_supports_quant_scheme_accepts_int4_w4a8_keys(wkey):
    assert CPUExpertsInt4._supports_quant_scheme(wkey, None) is True


@pytest.mark.parametrize(
    "wkey, akey",
    [
        (kInt4W4A8StaticGroup32Sym, QuantKey(np.int8, ScaleDesc(np.float32, False, GroupShape.PER_TOKEN))),
        (QuantKey(np.int8, ScaleDesc("bfloat16", True, GroupShape(1, 256))), None),
        (QuantKey(np.int8, ScaleDesc(np.float32, True, GroupShape(1, 32))), None),
        (QuantKey(np.int8, ScaleDesc("bfloat16", True, GroupShape(1, 32)), symmetric=False), None),
        (QuantKey(np.int8, ScaleDesc(np.float32, True, GroupShape.PER_CHANNEL), symmetric=False), None),
        (None, None),
    ],
)
def test_supports_quant_scheme_rejects_others(wkey, akey):
    assert CPUExpertsInt4._supports_quant_scheme(wkey, akey) is False


@pytest.mark.parametrize("method", list(RoutingMethodType))
def test_supports_routing_method(method):
    expected = method in (RoutingMethodType.Default, RoutingMethodType.Renormalize,
                          RoutingMethodType.RenormalizeNaive)
    assert CPUExpertsInt4._supports_routing_method(method, kInt4W4A8StaticGroup32Sym, None) is expected


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, None])
def test_supports_any_router_logits_dtype(dtype):
    assert CPUExpertsInt4._supports_router_logits_dtype(dtype, RoutingMethodType.Renormalize) is True


def test_misc_capabilities():
    experts = CPUExpertsInt4(FusedMoEConfig(8, 2, 64, 64), make_w4a8_int8_moe_quant_config((1, 32)))
    assert experts.supports_expert_map() is True
    assert experts.expects_unquantized_inputs is True
    assert experts.is_monolithic() is True
    assert experts.supports_lora() is False
    assert experts._supports_batch_invariance() is True


def _supported(cfg, wkey=kInt4W4A8StaticGroup32Sym, akey=None, fmt=STANDARD):
    return CPUExpertsInt4.is_supported_config(CPUExpertsInt4, cfg, wkey, akey, fmt)


@pytest.mark.parametrize("in_dtype", [np.float32, "bfloat16"])
def test_is_supported_config_ok(in_dtype):
    cfg = FusedMoEConfig(8, 2, 128, 256, routing_method=RoutingMethodType.Renormalize, in_dtype=in_dtype,
                         moe_parallel_config=FusedMoEParallelConfig(ep_size=2, use_ep=True))
    assert _supported(cfg) == (True, None)
    assert _supported(cfg, kInt4W4A8StaticChannelSym) == (True, None)
    assert _supported(cfg, kInt4W4A8StaticGroup128Sym) == (True, None)


@pytest.mark.parametrize(
    "cfg_kwargs, call_kwargs, reason",
    [
        (dict(in_dtype=np.float16), {}, "float16 input/output dtype"),
        (dict(activation=MoEActivation.SILU_NO_MUL), {}, "no act_and_mul MLP layer"),
        (dict(activation=MoEActivation.GELU), {}, "MoEActivation.GELU activation"),
        ({}, dict(akey=kInt4W4A8StaticGroup32Sym), "quantization scheme"),
        ({}, dict(wkey=None), "quantization scheme"),
        (dict(moe_parallel_config=FusedMoEParallelConfig(ep_size=2, use_ep=True, enable_eplb=True)), {},
         "parallel config"),
        (dict(routing_method=RoutingMethodType.DeepSeekV3), {}, "routing method"),
        ({}, dict(fmt=FusedMoEActivationFormat.BatchedExperts), "batched_experts activation format"),
        (dict(is_lora_enabled=True), {}, "LoRA"),
        (dict(hidden_dim=96), dict(wkey=kInt4W4A8StaticGroup64Sym), "hidden_dim=96 with group size 64"),
        (dict(intermediate_size=160), dict(wkey=kInt4W4A8StaticGroup64Sym),
         "intermediate_size_per_partition=160 with group size 64"),
    ],
)
def test_is_supported_config_reasons(cfg_kwargs, call_kwargs, reason):
    base = dict(num_experts=8, experts_per_token=2, hidden_dim=128, intermediate_size=256)
    base.update(cfg_kwargs)
    ok, why = _supported(FusedMoEConfig(**base), **call_kwargs)
    assert ok is False
    assert why.startswith("kernel does not support ")
    assert reason in why


# ----------------------------------------------------------------------------------------------
# _activation_kind
# ----------------------------------------------------------------------------------------------
def test_activation_kind_mapping():
    assert CPUExpertsInt4._activation_kind(MoEActivation.SWIGLUSTEP) == 0
    assert CPUExpertsInt4._activation_kind(MoEActivation.SWIGLUOAI) == 1
    assert CPUExpertsInt4._activation_kind(MoEActivation.SILU) == 2
    experts = CPUExpertsInt4(FusedMoEConfig(8, 2, 64, 64), make_w4a8_int8_moe_quant_config((1, 32)))
    assert experts._activation_kind(MoEActivation.SILU) == 2  # also callable on an instance, as in vLLM


@pytest.mark.parametrize("act", [MoEActivation.GELU, MoEActivation.SWIGLUOAI_UNINTERLEAVE, MoEActivation.RELU2_NO_MUL])
def test_activation_kind_rejects_others(act):
    with pytest.raises(ValueError, match="no dynamic_4bit_int_moe activation_kind"):
        CPUExpertsInt4._activation_kind(act)


# ----------------------------------------------------------------------------------------------
# apply, end to end
# ----------------------------------------------------------------------------------------------
class Layer:
    """Random float weights of one MoE layer and their int4_w4a8 packing."""

    def __init__(self, E=8, H=128, I=64, group=32, seed=0):
        rng = np.random.default_rng(seed)
        self.E, self.H, self.I, self.group = E, H, I, group
        self.w13 = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32)
        self.w2 = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
        self.p13 = moe_cpu.quantize_experts(self.w13, "int4_w4a8", group_size=group)
        self.p2 = moe_cpu.quantize_experts(self.w2, "int4_w4a8", group_size=group)
        self.rng = rng

    def inputs(self, M, scale=1.0):
        x = (self.rng.standard_normal((M, self.H)) * scale).astype(np.float32)
        logits = self.rng.standard_normal((M, self.E)).astype(np.float32)
        return x, logits

    def experts(self, k=2, routing=RoutingMethodType.Renormalize, activation=MoEActivation.SILU,
                quant_config=None, **kw):
        cfg = FusedMoEConfig(self.E, k, self.H, self.I, activation=activation, routing_method=routing, **kw)
        q = quant_config or make_w4a8_int8_moe_quant_config((1, self.group) if self.group > 0 else None)
        return CPUExpertsInt4(cfg, q)


def _apply(experts, layer, x, logits, activation=MoEActivation.SILU, expert_map=None, on_input=False,
           global_num_experts=None, w1=None, w2=None, **kw):
    return experts.apply(x, layer.p13 if w1 is None else w1, layer.p2 if w2 is None else w2, logits, activation,
                         layer.E if global_num_experts is None else global_num_experts, expert_map, None,
                         on_input, **kw)


ACTS = [MoEActivation.SILU, MoEActivation.SWIGLUSTEP, MoEActivation.SWIGLUOAI]


@pytest.mark.isa
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("routing", [RoutingMethodType.Default, RoutingMethodType.Renormalize,
                                     RoutingMethodType.RenormalizeNaive])
@pytest.mark.parametrize("on_input", [False, True])
def test_apply_equals_select_then_fused_experts(activation, routing, on_input):
    layer = Layer(seed=1)
    x, logits = layer.inputs(13)
    experts = layer.experts(k=3, routing=routing, activation=activation)
    out = _apply(experts, layer, x, logits, activation, on_input=on_input)

    tw, ti = moe_cpu.select_experts(logits, 3, renormalize=routing != RoutingMethodType.Default,
                                    scoring_func="softmax")
    ref = moe_cpu.fused_experts(x, layer.p13, layer.p2, tw, ti, activation=activation.value,
                                apply_router_weight_on_input=on_input)
    assert out.dtype == np.float32 and out.shape == (13, layer.H)
    np.testing.assert_array_equal(out, ref)


def _softmax_topk_float64(logits, k, renormalize):
    z = logits.astype(np.float64)
    ids = np.argsort(-z, axis=1, kind="stable")[:, :k]
    if renormalize:
        sel = np.take_along_axis(z, ids, 1)
        w = np.exp(sel - sel.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
    else:
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        w = np.take_along_axis(p, ids, 1)
    return w, ids


@pytest.mark.isa
@pytest.mark.parametrize("renormalize", [False, True])
def test_apply_close_to_unquantized_float64(renormalize):
    layer = Layer(seed=2)
    x, logits = layer.inputs(33)
    routing = RoutingMethodType.Renormalize if renormalize else RoutingMethodType.Default
    out = _apply(layer.experts(k=2, routing=routing), layer, x, logits)

    w64, ids64 = _softmax_topk_float64(logits, 2, renormalize)
    _, ids = moe_cpu.select_experts(logits, 2, renormalize=renormalize)
    np.testing.assert_array_equal(ids, ids64)  # same routing decisions as float64 math
    truth = reference.fused_experts_float64(x, layer.w13, layer.w2, w64, ids64, activation="silu")
    assert rel_l2(out, truth) < TOL_UNQUANT_REL_L2


@pytest.mark.isa
@pytest.mark.parametrize(
    "activation, vllm_kernel_activation",
    [
        (MoEActivation.SILU, None),
        # vLLM's dynamic_4bit_int_moe computes SiLU(g)*u for SWIGLUSTEP (kind 0) ...
        (MoEActivation.SWIGLUSTEP, "silu"),
        # ... and the OAI formula on the two halves for SWIGLUOAI (kind 1).
        (MoEActivation.SWIGLUOAI, "swigluoai_uninterleave"),
    ],
)
def test_apply_computes_the_design_activation(activation, vllm_kernel_activation):
    """Against float64 math on the dequantized weights; scaled inputs make the clamps (limit 7) bite."""
    layer = Layer(seed=3)
    x, logits = layer.inputs(40, scale=6.0)
    out = _apply(layer.experts(k=2, activation=activation), layer, x, logits, activation)

    tw, ti = moe_cpu.select_experts(logits, 2, renormalize=True)
    w13q, w2q = layer.p13.unpack(), layer.p2.unpack()
    truth = reference.fused_experts_float64(x, w13q, w2q, tw, ti, activation=activation.moe_cpu_name)
    assert rel_l2(out, truth) < TOL_DEQUANT_REL_L2
    if vllm_kernel_activation is not None:
        other = reference.fused_experts_float64(x, w13q, w2q, tw, ti, activation=vllm_kernel_activation)
        assert rel_l2(out, other) > 5 * TOL_DEQUANT_REL_L2  # really a different function


@pytest.mark.isa
def test_apply_per_channel_weights():
    layer = Layer(group=-1, seed=4)
    assert layer.p13.group_size == -1
    x, logits = layer.inputs(9)
    experts = layer.experts(quant_config=make_w4a8_int8_moe_quant_config(None))
    out = _apply(experts, layer, x, logits)
    tw, ti = moe_cpu.select_experts(logits, 2, renormalize=True)
    np.testing.assert_array_equal(out, moe_cpu.fused_experts(x, layer.p13, layer.p2, tw, ti))
    # The seed's spelling: per-token activation flag means "channel-wise weights" to CPUExpertsInt4.
    experts = layer.experts(quant_config=FusedMoEQuantConfig(weight_key=kInt4W4A8StaticChannelSym,
                                                             per_act_token_quant=True))
    np.testing.assert_array_equal(_apply(experts, layer, x, logits), out)


@pytest.mark.isa
def test_apply_bfloat16_hidden_states():
    layer = Layer(seed=5)
    x, logits = layer.inputs(11)
    xb = x.astype(BF16)
    out = _apply(layer.experts(in_dtype="bfloat16"), layer, xb, logits)
    assert out.dtype == BF16
    tw, ti = moe_cpu.select_experts(logits, 2, renormalize=True)
    ref = moe_cpu.fused_experts(xb, layer.p13, layer.p2, tw, ti)
    np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16))


@pytest.mark.isa
def test_apply_router_logits_of_other_float_dtypes_are_routed_in_float32():
    layer = Layer(seed=6)
    x, logits = layer.inputs(5)
    logits_bf16 = logits.astype(BF16)
    experts = layer.experts()
    out = _apply(experts, layer, x, logits_bf16)
    np.testing.assert_array_equal(out, _apply(experts, layer, x, logits_bf16.astype(np.float32)))
    out16 = _apply(experts, layer, x, logits.astype(np.float16))
    np.testing.assert_array_equal(out16, _apply(experts, layer, x, logits.astype(np.float16).astype(np.float32)))


@pytest.mark.isa
def test_apply_passes_biases_from_quant_config():
    layer = Layer(seed=7)
    x, logits = layer.inputs(6)
    b13 = layer.rng.standard_normal((layer.E, 2 * layer.I)).astype(np.float32)
    b2 = layer.rng.standard_normal((layer.E, layer.H)).astype(np.float32)
    q = make_w4a8_int8_moe_quant_config((1, 32), w1_bias=b13, w2_bias=b2)
    out = _apply(layer.experts(quant_config=q, has_bias=True), layer, x, logits)
    tw, ti = moe_cpu.select_experts(logits, 2, renormalize=True)
    ref = moe_cpu.fused_experts(x, layer.p13, layer.p2, tw, ti, w13_bias=b13, w2_bias=b2)
    np.testing.assert_array_equal(out, ref)
    assert not np.array_equal(out, _apply(layer.experts(), layer, x, logits))


@pytest.mark.isa
@pytest.mark.parametrize("map_dtype", [np.int32, np.int64])
def test_apply_expert_parallel_halves_sum_to_full_layer(map_dtype):
    layer = Layer(E=8, seed=8)
    x, logits = layer.inputs(21)
    full = _apply(layer.experts(k=3), layer, x, logits)

    half = layer.E // 2
    parts = []
    for rank in range(2):
        lo, hi = rank * half, (rank + 1) * half
        expert_map = np.full(layer.E, -1, dtype=map_dtype)
        expert_map[lo:hi] = np.arange(half)
        p13 = moe_cpu.quantize_experts(np.ascontiguousarray(layer.w13[lo:hi]), "int4_w4a8", group_size=32)
        p2 = moe_cpu.quantize_experts(np.ascontiguousarray(layer.w2[lo:hi]), "int4_w4a8", group_size=32)
        par = FusedMoEParallelConfig(ep_size=2, ep_rank=rank, use_ep=True)
        experts = layer.experts(k=3, moe_parallel_config=par)
        assert experts.moe_config.num_local_experts == half
        assert CPUExpertsInt4._supports_parallel_config(par)
        parts.append(_apply(experts, layer, x, logits, expert_map=expert_map, w1=p13, w2=p2))
    np.testing.assert_allclose(parts[0] + parts[1], full, rtol=TOL_EP_RTOL,
                               atol=TOL_EP_RTOL * float(np.abs(full).max()))
    assert np.abs(parts[0]).max() > 0 and np.abs(parts[1]).max() > 0


@pytest.mark.isa
def test_apply_grouped_routing_with_correction_bias():
    layer = Layer(E=16, seed=9)
    x, logits = layer.inputs(17)
    bias = layer.rng.standard_normal(layer.E).astype(np.float32)
    experts = layer.experts(k=4, routing=RoutingMethodType.Renormalize)
    kw = dict(num_expert_group=4, topk_group=2, e_score_correction_bias=bias, routed_scaling_factor=2.5)
    out = _apply(experts, layer, x, logits, **kw)

    tw, ti = moe_cpu.select_experts(logits, 4, renormalize=True, scoring_func="softmax", use_grouped_topk=True,
                                    num_expert_group=4, topk_group=2, e_score_correction_bias=bias,
                                    routed_scaling_factor=2.5)
    np.testing.assert_array_equal(out, moe_cpu.fused_experts(x, layer.p13, layer.p2, tw, ti))
    # Sanity of the routing itself: at most topk_group groups per token, weights sum to the scale.
    groups = ti // (layer.E // 4)
    assert max(len(set(row)) for row in groups.tolist()) <= 2
    np.testing.assert_allclose(tw.sum(1), 2.5, rtol=1e-5)
    # The bias changes the selection for some tokens (it is not ignored).
    _, ti_nobias = moe_cpu.select_experts(logits, 4, renormalize=True, use_grouped_topk=True,
                                          num_expert_group=4, topk_group=2, routed_scaling_factor=2.5)
    assert not np.array_equal(ti, ti_nobias)


@pytest.mark.isa
def test_apply_routed_scaling_factor_none_means_one():
    layer = Layer(seed=10)
    x, logits = layer.inputs(4)
    experts = layer.experts()
    np.testing.assert_array_equal(_apply(experts, layer, x, logits, routed_scaling_factor=None),
                                  _apply(experts, layer, x, logits, routed_scaling_factor=1.0))


@pytest.mark.isa
def test_apply_is_batch_invariant():
    layer = Layer(seed=11)
    x, logits = layer.inputs(19)
    experts = layer.experts(k=2)
    full = _apply(experts, layer, x, logits)
    for m in range(x.shape[0]):
        row = _apply(experts, layer, x[m:m + 1], logits[m:m + 1])
        np.testing.assert_array_equal(row[0], full[m])


# ----------------------------------------------------------------------------------------------
# apply: argument errors name the argument
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    layer = Layer(seed=12)
    x, logits = layer.inputs(5)
    return layer, x, logits


@pytest.mark.isa
def test_apply_rejects_wrong_hidden_width(small):
    layer, x, logits = small
    with pytest.raises(ValueError, match="hidden_states has 96 columns but moe_config.hidden_dim is 128"):
        _apply(layer.experts(), layer, x[:, :96].copy(), logits)
    with pytest.raises(ValueError, match="hidden_states must be 2-D"):
        _apply(layer.experts(), layer, x[0], logits)


@pytest.mark.isa
def test_apply_rejects_weights_of_the_wrong_shape(small):
    layer, x, logits = small
    other = Layer(I=96, seed=13)
    with pytest.raises(ValueError, match=r"w1 has \[N, K\] = \[192, 128\] per expert, expected \[128, 128\]"):
        _apply(layer.experts(), layer, x, logits, w1=other.p13)
    with pytest.raises(ValueError, match=r"w2 has \[N, K\] = \[128, 96\] per expert, expected \[128, 64\]"):
        _apply(layer.experts(), layer, x, logits, w2=other.p2)


@pytest.mark.isa
def test_apply_rejects_group_size_mismatch(small):
    layer, x, logits = small
    experts = layer.experts(quant_config=make_w4a8_int8_moe_quant_config((1, 64)))
    with pytest.raises(ValueError, match="w1 was packed with group_size=32 but quant_config asks for 64"):
        _apply(experts, layer, x, logits)
    experts = layer.experts(quant_config=make_w4a8_int8_moe_quant_config(None))
    with pytest.raises(ValueError, match="group_size=32 but quant_config asks for -1"):
        _apply(experts, layer, x, logits)


@pytest.mark.isa
def test_apply_rejects_non_int4_weights(small):
    layer, x, logits = small
    with pytest.raises(TypeError, match="w1 must be a moe_cpu.PackedExperts"):
        _apply(layer.experts(), layer, x, logits, w1=layer.w13)
    bf16 = moe_cpu.quantize_experts(layer.w2, "bf16")
    with pytest.raises(ValueError, match="w2 is packed as 'bf16'; CPUExpertsInt4 needs 'int4_w4a8'"):
        _apply(layer.experts(), layer, x, logits, w2=bf16)
    a16 = moe_cpu.quantize_experts(layer.w2, "int4_w4a16", -1)
    with pytest.raises(ValueError, match="w2 is packed as 'int4_w4a16'; CPUExpertsInt4 is vLLM's W4A8"):
        _apply(layer.experts(), layer, x, logits, w2=a16)


@pytest.mark.isa
def test_apply_rejects_bad_routing_arguments(small):
    layer, x, logits = small
    experts = layer.experts()
    with pytest.raises(ValueError, match=r"router_logits has shape \(5, 7\), expected \(5, 8\)"):
        _apply(experts, layer, x, logits[:, :7].copy())
    with pytest.raises(ValueError, match="topk_group=2 is given but num_expert_group is None"):
        _apply(experts, layer, x, logits, topk_group=2)
    with pytest.raises(ValueError, match=r"e_score_correction_bias has shape \(3,\)"):
        _apply(experts, layer, x, logits, num_expert_group=2, topk_group=1,
               e_score_correction_bias=np.zeros(3, np.float32))


@pytest.mark.isa
def test_apply_rejects_unsupported_activation_routing_and_scale(small):
    layer, x, logits = small
    with pytest.raises(ValueError, match="activation=GELU is not supported by CPUExpertsInt4"):
        _apply(layer.experts(), layer, x, logits, MoEActivation.GELU)
    with pytest.raises(ValueError, match="routing_method=DeepSeekV3 is not supported"):
        _apply(layer.experts(routing=RoutingMethodType.DeepSeekV3), layer, x, logits)
    with pytest.raises(ValueError, match="a1q_scale must be None"):
        layer.experts().apply(x, layer.p13, layer.p2, logits, MoEActivation.SILU, layer.E, None,
                              np.ones((5, 1), np.float32), False)


@pytest.mark.isa
def test_apply_rejects_bad_expert_map(small):
    layer, x, logits = small
    half = moe_cpu.quantize_experts(np.ascontiguousarray(layer.w13[:4]), "int4_w4a8", group_size=32)
    half2 = moe_cpu.quantize_experts(np.ascontiguousarray(layer.w2[:4]), "int4_w4a8", group_size=32)
    with pytest.raises(ValueError, match="w1 holds 4 experts but global_num_experts is 8; pass an expert_map"):
        _apply(layer.experts(), layer, x, logits, w1=half, w2=half2)
    with pytest.raises(ValueError, match=r"expert_map has shape \(4,\), expected \(8,\)"):
        _apply(layer.experts(), layer, x, logits, w1=half, w2=half2, expert_map=np.arange(4, dtype=np.int32))
    with pytest.raises(ValueError, match="w1 holds 8 experts but w2 holds 4"):
        _apply(layer.experts(), layer, x, logits, w2=half2)


def test_reexported_at_top_level():
    for name in vc.__all__:
        assert getattr(moe_cpu, name) is getattr(vc, name), name
