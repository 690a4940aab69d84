"""A8 activation blocks (docs/numerics.md, "Activation blocks"): one int8 scale per `act_block` channels of each
token, against reference.py's independent blocked quantizer, on every ISA level (`isa`); the API, files and bad
input."""
import numpy as np
import pytest

import moe_cpu
from conftest import assert_close, make_input, make_routing, make_weights, ref

pytestmark = pytest.mark.isa

# (scheme, group, w13 block, w2 block): blocks shorter than the groups (pieces), spanning several groups, per
# channel, zero points, int8 groups of 16 (Q6_K) and 32 (Q8_0), and a pair whose GEMMs take different blocks.
CONFIGS = {
    "int4_g32_b32": ("int4_w4a8", 32, 32, 32, False),
    "int4_g128_b32": ("int4_w4a8", 128, 32, 32, False),
    "int4_g32_b256_b128": ("int4_w4a8", 32, 256, 128, False),
    "int4_pc_b64": ("int4_w4a8", -1, 64, 64, False),
    "int4_g64_zp_b32": ("int4_w4a8", 64, 32, 128, True),
    "int8_pc_b32": ("int8_w8a8", -1, 32, 32, False),
    "int8_g16_b32": ("int8_w8a8", 16, 32, 32, False),
    "int8_g32_b128_token": ("int8_w8a8", 32, 128, None, False),
}


def layer_weights(rng, name, E, H, I):
    scheme, g, b13, b2, zeros = CONFIGS[name]
    w13r, w13p = make_weights(rng, scheme, E, 2 * I, H, group_size=g, zeros=zeros, act_block=b13)
    w2r, w2p = make_weights(rng, scheme, E, H, I, group_size=g, zeros=zeros, act_block=b2)
    return scheme, w13r, w13p, w2r, w2p


@pytest.mark.parametrize("M", [1, 5, 40])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_blocks_match_the_reference(rng, name, M):
    E, H, I, k = 6, 512, 256, 2
    scheme, w13r, w13p, w2r, w2p = layer_weights(rng, name, E, H, I)
    assert (w13p.act_block, w2p.act_block) == CONFIGS[name][2:4]
    x = make_input(rng, M, H)
    x[:, 64:96] *= 40          # one block of large values: a per-token scale would flatten the others
    tw, ti = make_routing(rng, M, E, k)
    got = moe_cpu.fused_experts(x, w13p, w2p, tw, ti)
    want = ref.fused_experts_ref(x, w13r, w2r, tw, ti)
    assert_close(got, want, scheme, f"{name} M={M}")


@pytest.mark.parametrize("opts", [dict(dtype="bfloat16"), dict(on_input=True), dict(activation="swigluoai")])
def test_blocks_with_bf16_router_weight_on_input_and_interleaved_activation(rng, opts):
    E, H, I, k, M = 4, 256, 128, 2, 17
    scheme, w13r, w13p, w2r, w2p = layer_weights(rng, "int4_g128_b32", E, H, I)
    x = make_input(rng, M, H, opts.get("dtype", "float32"))
    tw, ti = make_routing(rng, M, E, k)
    kw = dict(apply_router_weight_on_input=opts.get("on_input", False), activation=opts.get("activation", "silu"))
    got = moe_cpu.fused_experts(x, w13p, w2p, tw, ti, **kw)
    assert_close(got, ref.fused_experts_ref(x, w13r, w2r, tw, ti, **kw), scheme, str(opts))


def test_blocks_on_codebook_and_mins_forms(rng):
    """K-quant-like weights (unsigned codes, float mins) and IQ4_NL's codebook, with blocks of 32 and 256."""
    E, H, I, k, M = 4, 512, 256, 2, 9
    cb = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
    for codebook, mins, block in ((np.arange(16, dtype=np.int8), True, 256), (cb, False, 32), (cb, True, 32)):
        pair = []
        for N, K in ((2 * I, H), (H, I)):
            q = rng.integers(0, 16, (E, N, K)).astype(np.uint8)
            s = (rng.random((E, N, K // 32)) * 0.01).astype(np.float32)
            m = (rng.random((E, N, K // 32)) * 0.05).astype(np.float32) if mins else None
            pair.append((ref.RefWeights.int4(q, s, 32, codebook=codebook, mins=m, act_block=block),
                         moe_cpu.pack_int4(q, s, 32, codebook=codebook, mins=m, act_block=block)))
        (w13r, w13p), (w2r, w2p) = pair
        x = make_input(rng, M, H)
        tw, ti = make_routing(rng, M, E, k)
        got = moe_cpu.fused_experts(x, w13p, w2p, tw, ti)
        assert_close(got, ref.fused_experts_ref(x, w13r, w2r, tw, ti), "int4_w4a8", f"mins={mins} B={block}")


def test_blocks_are_finer_than_per_token_on_outlier_blocks(rng):
    """The same codes with blocks of 32 against per token, both against float64 on the dequantized weights: with
    a few large channels the blocked error is several times smaller."""
    E, H, I, k, M = 8, 512, 256, 2, 32
    w13 = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32)
    w2 = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
    x = rng.standard_normal((M, H)).astype(np.float32)
    x[:, [5, 300]] *= 50
    tw, ti = make_routing(rng, M, E, k)
    err = {}
    for block in (None, 32):
        p13 = moe_cpu.quantize_experts(w13, "int8_w8a8", act_block=block)
        p2 = moe_cpu.quantize_experts(w2, "int8_w8a8", act_block=block)
        got = moe_cpu.fused_experts(x, p13, p2, tw, ti).astype(np.float64)
        want = ref.fused_experts_float64(x, p13.unpack(), p2.unpack(), tw, ti)
        err[block] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert err[32] * 3 < err[None], err


def test_threads_and_batch_rows_give_the_same_bits(rng):
    E, H, I, k, M = 6, 256, 128, 3, 33
    _, _, w13p, _, w2p = layer_weights(rng, "int4_g128_b32", E, H, I)
    x = make_input(rng, M, H)
    tw, ti = make_routing(rng, M, E, k)
    n = moe_cpu.get_num_threads()
    try:
        moe_cpu.set_num_threads(1)
        one = moe_cpu.fused_experts(x, w13p, w2p, tw, ti)
    finally:
        moe_cpu.set_num_threads(n)
    many = moe_cpu.fused_experts(x, w13p, w2p, tw, ti)
    np.testing.assert_array_equal(one, many)
    row = moe_cpu.fused_experts(x[5:6], w13p, w2p, tw[5:6], ti[5:6])
    np.testing.assert_array_equal(row[0], many[5])


def test_attribute_repr_and_file_round_trip(rng, tmp_path):
    _, _, w13p, _, w2p = layer_weights(rng, "int4_g32_b256_b128", 2, 256, 128)
    assert w13p.act_block == 256 and "act_block=256" in repr(w13p)
    plain = moe_cpu.quantize_experts(np.ones((1, 32, 64), np.float32), "int8_w8a8")
    assert plain.act_block is None and "act_block=None" in repr(plain)
    a16 = moe_cpu.quantize_experts(np.ones((1, 32, 64), np.float32), "int8_w8a16")
    assert a16.act_block is None and "act_block" not in repr(a16)
    for p, version in ((w13p, 5), (w2p, 5), (plain, 3)):
        path = tmp_path / f"w{version}_{p.act_block}.moepk"
        p.save(path)
        assert int.from_bytes(path.read_bytes()[8:12], "little") == version
        back = moe_cpu.load_packed(path)
        assert back.act_block == p.act_block and back.kernel == p.kernel
        np.testing.assert_array_equal(back.unpack(), p.unpack())
    x = make_input(rng, 3, 256)
    tw, ti = make_routing(rng, 3, 2, 1)
    w13b, w2b = (moe_cpu.load_packed(tmp_path / f"w5_{b}.moepk") for b in (256, 128))
    np.testing.assert_array_equal(moe_cpu.fused_experts(x, w13b, w2b, tw, ti), moe_cpu.fused_experts(x, w13p, w2p, tw, ti))


@pytest.mark.parametrize("block,err,match", [
    (0, ValueError, r"act_block = 0 is not supported: use one of \(32, 64, 128, 256\)"),
    (-32, ValueError, r"act_block = -32 is not supported"),
    (48, ValueError, r"act_block = 48 is not supported"),
    (512, ValueError, r"act_block = 512 is not supported"),
    (True, TypeError, r"act_block must be an int"),
    ("32", TypeError, r"act_block must be an int"),
    (256, ValueError, r"act_block = 256 does not divide the GEMM's K = 192"),
    (128, ValueError, r"act_block = 128 does not divide the GEMM's K = 192"),
])
def test_bad_blocks_raise(block, err, match):
    w = np.ones((2, 32, 192), np.float32)
    with pytest.raises(err, match=match):
        moe_cpu.quantize_experts(w, "int4_w4a8", group_size=32, act_block=block)


def test_blocks_that_do_not_fit_the_weights_raise():
    q = np.zeros((1, 16, 192), np.int8)
    with pytest.raises(ValueError, match=r"act_block = 64 neither divides the weights' group_size = 96 nor is a multiple"):
        moe_cpu.pack_int8(q, np.ones((1, 16, 2), np.float32), group_size=96, act_block=64)
    for scheme in ("int4_w4a16", "int8_w8a16", "fp8_w8a16", "bf16"):
        with pytest.raises(ValueError, match=r"activation blocks apply to the A8 schemes"):
            moe_cpu.quantize_experts(np.ones((1, 16, 128), np.float32), scheme,
                                     group_size=None if scheme in ("fp8_w8a16", "bf16") else 32, act_block=32)
    g_idx = np.repeat(np.arange(4), 32)[::-1].copy()
    with pytest.raises(ValueError, match=r"act_block = 32: act-order weights \(g_idx\) take per-token activations only"):
        moe_cpu.pack_int4(np.zeros((1, 16, 128), np.int8), np.ones((1, 16, 4), np.float32), 32, g_idx=g_idx, act_block=32)


@pytest.mark.parametrize("scheme,block", [("int4_w4a8", 32), ("int8_w8a8", 256), ("int4_w4a16", None)])
def test_expert_subsets_keep_the_activations(rng, scheme, block):
    """EPMoELayer.from_layer's take_experts: a rank's experts keep the scheme (A8 / A16) and the block, so they
    compute what they computed in the whole layer (bit for bit)."""
    from moe_cpu.distributed.take import take_experts
    E, H, I, M = 6, 256, 256, 5
    w13 = moe_cpu.quantize_experts(rng.standard_normal((E, 2 * I, H), dtype=np.float32), scheme, group_size=32,
                                   act_block=block)
    w2 = moe_cpu.quantize_experts(rng.standard_normal((E, H, I), dtype=np.float32), scheme, group_size=32,
                                  act_block=block)
    own = [4, 1]
    s13, s2 = take_experts(w13, own), take_experts(w2, own)
    assert (s13.scheme, s13.act_block, s2.act_block) == (scheme, block, block)
    x = make_input(rng, M, H)
    tw = np.ones((M, 1), np.float32)
    got = moe_cpu.fused_experts(x, s13, s2, tw, np.zeros((M, 1), np.int32))       # local expert 0 = global 4
    want = moe_cpu.fused_experts(x, w13, w2, tw, np.full((M, 1), 4, np.int32))
    np.testing.assert_array_equal(got, want)
