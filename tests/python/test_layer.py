"""MoELayer (moe_cpu/layer.py) against the independent NumPy reference.

Each test builds a layer with MoELayer.from_float, then recomputes it here from the packed codes
(unpack_quantized -> RefWeights): router logits in float64, reference.select_experts_ref,
reference.fused_experts_ref and reference.shared_expert_ref, compared with the scheme tolerances.
"""
import ml_dtypes
import numpy as np
import pytest

import moe_cpu
from conftest import assert_close, float_weights, ref

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

H, I_INT4, I_ODD = 128, 96, 45
QUALITY = {"int4_w4a8": 0.25, "int8_w8a8": 0.05, "fp8_w8a16": 0.05, "bf16": 0.01,   # relative L2 limits
           "int4_w4a16": 0.25, "int8_w8a16": 0.05}


def inter(scheme):
    return I_INT4 if scheme.startswith("int4") else I_ODD


def group(scheme):
    return 32 if scheme.startswith("int4") else None


def ref_weights(p):
    """RefWeights holding the same codes and scales as the PackedExperts p."""
    d = p.unpack_quantized()
    if p.scheme.startswith("int4"):
        return ref.RefWeights.int4(d["qweight"], d["scales"], p.group_size, d["zeros"], scheme=p.scheme)
    if p.scheme.startswith("int8"):
        return ref.RefWeights.int8(d["qweight"], d["scales"], p.group_size, scheme=p.scheme)
    if p.scheme == "fp8_w8a16":
        return ref.RefWeights.fp8(d["weight"], d["scale_inv"], p.block_size)
    return ref.RefWeights.bf16(d["weight"])


def floats(rng, E, I, Is=None, biases=False):
    """Float32 layer weights: gate, w13, w2 and optionally biases and a shared expert."""
    f = dict(gate=(rng.standard_normal((E, H)) / np.sqrt(H)).astype(np.float32),
             w13=float_weights(rng, E, 2 * I, H), w2=float_weights(rng, E, H, I))
    if biases:
        f["w13_bias"] = (0.1 * rng.standard_normal((E, 2 * I))).astype(np.float32)
        f["w2_bias"] = (0.1 * rng.standard_normal((E, H))).astype(np.float32)
    if Is:
        f["shared_w13"] = float_weights(rng, 1, 2 * Is, H)[0]
        f["shared_w2"] = float_weights(rng, 1, H, Is)[0]
    return f


def expected(layer, x):
    """The layer recomputed from its packed codes with moe_cpu.reference -> float64 [M, H]."""
    logits = (ref.to_float32_values(x).astype(np.float64) @ layer.gate.T.astype(np.float64)).astype(np.float32)
    routing = dict(renormalize=layer.renormalize, scoring_func=layer.scoring_func,
                   use_grouped_topk=layer.use_grouped_topk, num_expert_group=layer.num_expert_group,
                   topk_group=layer.topk_group, e_score_correction_bias=layer.e_score_correction_bias,
                   routed_scaling_factor=layer.routed_scaling_factor)
    tw, ids = ref.select_experts_ref(logits, layer.top_k, **routing)
    out = ref.fused_experts_ref(x, ref_weights(layer.w13), ref_weights(layer.w2), tw, ids, layer.activation,
                                w13_bias=layer.w13_bias, w2_bias=layer.w2_bias)
    if layer.shared_w13 is not None:   # the routed output is rounded to x's dtype before the shared add
        routed = out.astype(np.float32)
        if x.dtype != np.float32:
            routed = ref.float_to_bf16_bits(routed)
        out = ref.shared_expert_ref(x, ref_weights(layer.shared_w13), ref_weights(layer.shared_w2), routed, 1.0)
    return out


def check(layer, x, what):
    got = layer(x)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert_close(got, expected(layer, x), layer.scheme, what)
    return got


def deepseek_like(rng, scheme, E=8, Is=64):
    bias = (0.1 * rng.standard_normal(E)).astype(np.float32)
    return moe_cpu.MoELayer.from_float(
        **floats(rng, E, inter(scheme), Is=Is), scheme=scheme, group_size=group(scheme), top_k=3,
        scoring_func="sigmoid", renormalize=True, use_grouped_topk=True, num_expert_group=4, topk_group=2,
        e_score_correction_bias=bias, routed_scaling_factor=2.5)


# ---------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("scheme", moe_cpu.SCHEMES)
def test_from_float_each_scheme(rng, scheme):
    layer = moe_cpu.MoELayer.from_float(**floats(rng, 6, inter(scheme)), scheme=scheme,
                                        group_size=group(scheme), top_k=2, renormalize=True)
    assert layer.scheme == scheme and layer.intermediate_size == inter(scheme)
    x = rng.standard_normal((20, H)).astype(np.float32)
    check(layer, x, scheme)
    _, ids = layer.route(x)
    assert np.array_equal(ids, ref.select_experts_ref(layer.router_logits(x), 2, renormalize=True)[1])


def lane_sum_logits(x, gate):
    """The router's documented float32 order (kernels/router_dots.h), in NumPy: 16 lane sums over k (lane j takes
    k = j mod 16, a product then a sum, each rounded), the tail zero-padded, then the tree 16 -> 8 -> 4 -> 2 -> 1."""
    M, Hx = x.shape
    pad = -Hx % 16
    xp, gp = np.pad(x, ((0, 0), (0, pad))), np.pad(gate, ((0, 0), (0, pad)))
    lanes = np.zeros((M, gate.shape[0], 16), np.float32)
    for k in range(0, Hx + pad, 16):
        lanes += xp[:, None, k:k + 16] * gp[None, :, k:k + 16]
    for w in (8, 4, 2, 1):
        lanes[..., :w] += lanes[..., w:2 * w]
    return lanes[..., 0]


@pytest.mark.parametrize("Hx", [128, 200])
def test_router_logits_bits_are_the_lane_sum_order(rng, Hx):
    # Every ISA word (portable, AVX2, AVX-512, NEON) gives these bits: this test runs at every level.
    E = 24
    gate = rng.standard_normal((E, Hx)).astype(np.float32)
    w13 = moe_cpu.quantize_experts(float_weights(rng, E, 64, Hx), "bf16")
    w2 = moe_cpu.quantize_experts(float_weights(rng, E, Hx, 32), "bf16")
    layer = moe_cpu.MoELayer(gate, w13, w2, top_k=2)
    for M in (1, 3, 7):
        x = rng.standard_normal((M, Hx)).astype(np.float32)
        assert np.array_equal(layer.router_logits(x), lane_sum_logits(x, gate))


@pytest.mark.parametrize("Hx", [128, 200])
def test_router_reads_a_bf16_gate_as_bf16_with_the_same_logits(rng, Hx):
    # A gate whose every value is a bf16 (a router from a bf16 checkpoint) is read as bf16 bits, widened exactly: the
    # layer's routing is then that of the float32 logits, bit for bit (rows 1-7: every row count of the dots).
    E = 24
    gate = (rng.standard_normal((E, Hx)).astype(np.float32).view(np.uint32) & np.uint32(0xffff0000)).view(np.float32)
    w13 = moe_cpu.quantize_experts(float_weights(rng, E, 64, Hx), "bf16")
    w2 = moe_cpu.quantize_experts(float_weights(rng, E, Hx, 32), "bf16")
    layer = moe_cpu.MoELayer(gate, w13, w2, top_k=3)
    assert layer._plan.gate_bf16
    for M in (1, 3, 4, 7):
        x = rng.standard_normal((M, Hx)).astype(np.float32)
        assert np.array_equal(layer.router_logits(x), lane_sum_logits(x, gate))
        w, ids = layer.route(x)
        assert np.array_equal(layer(x), layer.run_experts(x, w, ids))
    # one value that is not a bf16: the float32 gate, as before
    gate2 = gate.copy()
    gate2[E - 1, Hx - 1] = np.nextafter(gate2[E - 1, Hx - 1], np.float32(np.inf))
    layer2 = moe_cpu.MoELayer(gate2, w13, w2, top_k=3)
    assert not layer2._plan.gate_bf16
    x = rng.standard_normal((5, Hx)).astype(np.float32)
    assert np.array_equal(layer2(x), layer2.run_experts(x, *layer2.route(x)))


@pytest.mark.parametrize("scheme", ["int4_w4a8", "fp8_w8a16"])
def test_deepseek_like_grouped_bias_scaling_shared(rng, scheme):
    layer = deepseek_like(rng, scheme)
    check(layer, rng.standard_normal((20, H)).astype(np.float32), f"deepseek-like {scheme}")


def test_routed_scaling_applies_before_shared_expert(rng):
    # factor * routed + shared: the layer with factor 2.5 minus the layer with factor 1 is 1.5 * routed
    f = floats(rng, 8, I_ODD, Is=32)
    kw = dict(scheme="bf16", top_k=2, renormalize=True)
    x = rng.standard_normal((4, H)).astype(np.float32)
    a = moe_cpu.MoELayer.from_float(**f, routed_scaling_factor=2.5, **kw)(x).astype(np.float64)
    b = moe_cpu.MoELayer.from_float(**f, **kw)(x).astype(np.float64)
    no_shared = {n: v for n, v in f.items() if not n.startswith("shared")}
    routed = moe_cpu.MoELayer.from_float(**no_shared, **kw)(x).astype(np.float64)
    np.testing.assert_allclose(a - b, 1.5 * routed, atol=1e-5 * np.abs(routed).max())


def test_sigmoid_routing(rng):
    layer = moe_cpu.MoELayer.from_float(**floats(rng, 8, I_ODD), scheme="int8_w8a8", top_k=3,
                                        scoring_func="sigmoid")
    check(layer, rng.standard_normal((17, H)).astype(np.float32), "sigmoid")


@pytest.mark.parametrize("scheme", ["int4_w4a8", "bf16"])
def test_gpt_oss_like_swigluoai_biases(rng, scheme):
    layer = moe_cpu.MoELayer.from_float(**floats(rng, 8, inter(scheme), biases=True), scheme=scheme,
                                        group_size=group(scheme), top_k=4, renormalize=True,
                                        activation="swigluoai")
    check(layer, (4 * rng.standard_normal((18, H))).astype(np.float32), f"gpt-oss-like {scheme}")


@pytest.mark.parametrize("kind", ["bfloat16", "uint16"])
def test_bf16_input_keeps_dtype(rng, kind):
    layer = deepseek_like(rng, "int8_w8a8")
    bits = ref.float_to_bf16_bits(rng.standard_normal((16, H)).astype(np.float32))
    x = bits.view(ml_dtypes.bfloat16) if kind == "bfloat16" else bits
    out = check(layer, x, f"bf16 input ({kind})")
    assert out.dtype == x.dtype


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_zero_tokens(rng, dtype):
    layer = deepseek_like(rng, "bf16")
    x = np.zeros((0, H), dtype)
    out = layer(x)
    assert out.shape == (0, H) and out.dtype == x.dtype
    assert layer.reference(x).shape == (0, H)


# ------------------------------------------------------------------------ accuracy helpers
@pytest.mark.parametrize("scheme", moe_cpu.SCHEMES)
def test_reference_within_quantization_error(rng, scheme):
    """layer.reference (dequantized weights, float64) and the unquantized float64 layer vs layer(x)."""
    f = floats(rng, 8, inter(scheme), Is=64)
    layer = moe_cpu.MoELayer.from_float(**f, scheme=scheme, group_size=group(scheme), top_k=2, renormalize=True)
    x = rng.standard_normal((32, H)).astype(np.float32)
    got = layer(x).astype(np.float64)
    want = layer.reference(x)
    assert want.dtype == np.float64

    def rel(a, b):
        return np.linalg.norm(a - b) / np.linalg.norm(b)

    assert rel(got, want) < QUALITY[scheme]
    # ground truth from the float weights (same routing): the whole quantization error stays in bounds
    tw, ids = ref.select_experts_ref(layer.router_logits(x), 2, renormalize=True)
    M = x.shape[0]
    truth = ref.fused_experts_float64(x, f["w13"], f["w2"], tw, ids) + ref.fused_experts_float64(
        x, f["shared_w13"][None], f["shared_w2"][None], np.ones((M, 1), np.float32), np.zeros((M, 1), np.int32))
    assert rel(got, truth) < QUALITY[scheme]
    assert rel(want, truth) < QUALITY[scheme]


def test_repr_and_sizes(rng):
    layer = deepseek_like(rng, "int4_w4a8")
    text = repr(layer)
    for part in ("E=8", f"H={H}", f"I={I_INT4}", "top_k=3", "int4_w4a8", "group 32", layer.w13.kernel,
                 "grouped sigmoid", "2 of 4 groups", "correction bias", "scale 2.5", "activation=silu",
                 "shared expert: Is=64", "KiB"):
        assert part in text, (part, text)
    assert layer.nbytes == sum(w.nbytes for w in (layer.w13, layer.w2, layer.shared_w13, layer.shared_w2))
    assert (layer.num_experts, layer.hidden_size, layer.has_shared_expert) == (8, H, True)
    plain = moe_cpu.MoELayer.from_float(**floats(rng, 4, I_ODD), scheme="fp8_w8a16", top_k=2)
    assert "softmax top-2" in repr(plain) and "shared" not in repr(plain)
    assert "MoELayer" in moe_cpu.__all__


# ---------------------------------------------------------------------------------- bad input
@pytest.fixture
def parts(rng):
    E, I = 4, 64
    f = floats(rng, E, I)
    return dict(gate=f["gate"], w13=moe_cpu.quantize_experts(f["w13"], "int8_w8a8"),
                w2=moe_cpu.quantize_experts(f["w2"], "int8_w8a8"), top_k=2)


def _shared(rng, scheme="int8_w8a8", E=1, Is=32):
    return dict(shared_w13=moe_cpu.quantize_experts(float_weights(rng, E, 2 * Is, H), scheme),
                shared_w2=moe_cpu.quantize_experts(float_weights(rng, E, H, Is), scheme))


@pytest.mark.parametrize("change,err,match", [
    (lambda p, r: dict(gate=np.zeros((4, H + 1), np.float32)), ValueError, "gate"),
    (lambda p, r: dict(gate=np.zeros((5, H), np.float32)), ValueError, "gate"),
    (lambda p, r: dict(gate=p["gate"].astype(np.float64)), TypeError, "gate"),
    (lambda p, r: dict(w2=moe_cpu.quantize_experts(float_weights(r, 4, H, 64), "bf16")), ValueError, "same scheme"),
    (lambda p, r: dict(w2=moe_cpu.quantize_experts(float_weights(r, 4, H, 32), "int8_w8a8")), ValueError, "w2"),
    (lambda p, r: dict(w13=p["gate"]), TypeError, "w13"),
    (lambda p, r: dict(top_k=5), ValueError, "top_k"),
    (lambda p, r: dict(top_k=2.0), TypeError, "top_k"),
    (lambda p, r: dict(w13_bias=np.zeros((4, 64), np.float32)), ValueError, "w13_bias"),
    (lambda p, r: dict(w2_bias=np.zeros((4, H), np.float64)), TypeError, "w2_bias"),
    (lambda p, r: dict(e_score_correction_bias=np.zeros(3, np.float32)), ValueError, "e_score_correction_bias"),
    (lambda p, r: dict(shared_w13=p["w13"]), ValueError, "shared_w13 and shared_w2"),
    (lambda p, r: _shared(r, E=2), ValueError, "num_experts == 1"),
    (lambda p, r: dict(_shared(r), shared_w2=_shared(r, "bf16")["shared_w2"]), ValueError, "shared_w13"),
    (lambda p, r: dict(activation="relu"), ValueError, "activation"),
    (lambda p, r: dict(scoring_func="tanh"), ValueError, "scoring_func"),
    (lambda p, r: dict(use_grouped_topk=True), ValueError, "num_expert_group"),
    (lambda p, r: dict(use_grouped_topk=True, num_expert_group=3, topk_group=1), ValueError, "num_expert_group"),
    (lambda p, r: dict(use_grouped_topk=True, num_expert_group=2, topk_group=3), ValueError, "topk_group"),
    (lambda p, r: dict(num_expert_group=2), ValueError, "use_grouped_topk"),
    (lambda p, r: dict(routed_scaling_factor=float("nan")), ValueError, "routed_scaling_factor"),
    # non-finite parameters, named at construction (not as router_logits or topk_weights at call time)
    (lambda p, r: dict(gate=np.where(np.arange(H) == 7, np.nan, p["gate"]).astype(np.float32)), ValueError,
     r"gate\[0, 7\] = nan is not finite"),
    (lambda p, r: dict(gate_bias=np.float32([0, 0, np.inf, 0])), ValueError, r"gate_bias\[2\] = inf"),
    (lambda p, r: dict(w13_bias=np.full((4, 128), -np.inf, np.float32)), ValueError, r"w13_bias\[0, 0\] = -inf"),
    (lambda p, r: dict(w2_bias=np.where(np.arange(H) == H - 1, np.nan, 0).astype(np.float32)[None].repeat(4, 0)),
     ValueError, rf"w2_bias\[0, {H - 1}\] = nan"),
    (lambda p, r: dict(e_score_correction_bias=np.float32([0, np.nan, 0, 0])), ValueError,
     r"e_score_correction_bias\[1\] = nan"),
    (lambda p, r: dict(_shared(r), shared_expert_gate=np.full(H, np.nan, np.float32)), ValueError,
     r"shared_expert_gate\[0\] = nan"),
])
def test_bad_construction(rng, parts, change, err, match):
    with pytest.raises(err, match=match):
        moe_cpu.MoELayer(**{**parts, **change(parts, rng)})


def test_bad_input_to_call(parts):
    layer = moe_cpu.MoELayer(**parts)
    with pytest.raises(ValueError, match="x has shape"):
        layer(np.zeros((2, H + 1), np.float32))
    with pytest.raises(TypeError, match="x must be float32 or bfloat16"):
        layer(np.zeros((2, H), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        layer(np.zeros((H, 2), np.float32).T)


def test_from_float_errors_name_the_argument(rng):
    f = floats(rng, 4, 64, Is=48)
    with pytest.raises(ValueError, match="shared_w2: group_size = 32"):   # 32 does not divide Is = 48
        moe_cpu.MoELayer.from_float(**f, scheme="int4_w4a8", group_size=32, top_k=2)
    with pytest.raises(ValueError, match="w13"):
        moe_cpu.MoELayer.from_float(f["gate"], f["w13"][0], f["w2"], top_k=2)
    with pytest.raises(TypeError, match="w2"):
        moe_cpu.MoELayer.from_float(f["gate"], f["w13"], f["w2"].astype(np.float64), top_k=2)
    with pytest.raises(ValueError, match="shared_w13 and shared_w2"):
        moe_cpu.MoELayer.from_float(f["gate"], f["w13"], f["w2"], shared_w13=f["shared_w13"], top_k=2)


def test_from_pretrained_refuses_comm_and_names_the_expert_parallel_entry():
    with pytest.raises(TypeError, match=r"EPMoELayer\.from_pretrained"):
        moe_cpu.MoELayer.from_pretrained("no/such/checkpoint", 0, comm=object())


def test_result_rounding_to_bf16_equals_the_reference_bit_for_bit(rng):
    """The layers' one rounding of fp32 results to bf16 (moe_cpu._dtypes) against the oracle's, on random bit
    patterns (NaN, inf, subnormals, ties) and the edges."""
    from moe_cpu._dtypes import to_bf16_bits

    bits = rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0x7F7FFFFF, 0x7F7F8000, 0x3F808000, 0x3F818000, 0x00008000, 0x80000000, 0x7F800000,
                      0xFF800000, 0x7FC00001, 0xFFFFFFFF], np.uint32)
    x = np.concatenate([bits, edges]).view(np.float32).reshape(-1, 2)
    np.testing.assert_array_equal(to_bf16_bits(x), ref.float_to_bf16_bits(x))
