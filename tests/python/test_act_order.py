"""GPTQ act-order (g_idx): packing sorts each expert's input channels by group, fused_experts gathers
the activations in that order. Checked against reference.py on the un-permuted weights, and bit for
bit against the same weights packed with the activations permuted by hand."""
import numpy as np
import pytest

import moe_cpu
from conftest import assert_close, make_input, make_routing, ref

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)


def act_order_map(rng, E, K, g, shared=False):
    """A random valid GPTQ g_idx [E, K]: g_idx[perm[i]] = i // g for a random permutation perm."""
    out = np.empty((E, K), np.int32)
    perm = rng.permutation(K)
    for e in range(E):
        if not shared:
            perm = rng.permutation(K)
        out[e, perm] = np.arange(K) // g
    return out


def int4_zp(rng, E, N, K, g, g_idx, scheme="int4_w4a8"):
    """(RefWeights, PackedExperts) of random uint8 codes with zero points and the group map g_idx."""
    q = rng.integers(0, 16, (E, N, K)).astype(np.uint8)
    z = rng.integers(4, 12, (E, N, K // g)).astype(np.uint8)
    s = (rng.uniform(0.5, 1.5, (E, N, K // g)) / (4 * np.sqrt(K))).astype(np.float32)
    return (ref.RefWeights.int4(q, s, g, zeros=z, g_idx=g_idx, scheme=scheme),
            moe_cpu.pack_int4(q, s, g, z, g_idx=g_idx, scheme=scheme))


A16 = pytest.mark.parametrize("a16", [False, True], ids=["a8", "a16"])


def schemes(a16):
    """(int4 scheme, int8 scheme) with int8 or 16-bit activations."""
    return ("int4_w4a16", "int8_w8a16") if a16 else ("int4_w4a8", "int8_w8a8")


def test_round_trip_and_unpack_in_original_order(rng):
    E, N, K, g = 3, 40, 128, 32
    gi = act_order_map(rng, E, K, g)
    r, p = int4_zp(rng, E, N, K, g, gi)
    assert p.form == "int4+zeros+act_order" and f"form={p.form}" in repr(p)
    d = p.unpack_quantized()
    np.testing.assert_array_equal(d["qweight"], r.codes)      # the caller's channel order
    np.testing.assert_array_equal(d["g_idx"], gi)
    np.testing.assert_array_equal(d["zeros"], r.zeros)
    # w[e, n, k] = (q - zero[g_idx[k]]) * scale[g_idx[k]], written out independently of RefWeights
    z = np.take_along_axis(r.zeros.astype(np.float32), np.broadcast_to(gi[:, None, :], (E, N, K)), axis=2)
    s = np.take_along_axis(r.scales, np.broadcast_to(gi[:, None, :], (E, N, K)), axis=2)
    np.testing.assert_array_equal(p.unpack(), (r.codes.astype(np.float32) - z) * s)
    np.testing.assert_array_equal(r.dequantize().astype(np.float32), p.unpack())   # exact products
    again = moe_cpu.pack_int4(d["qweight"], d["scales"], g, d["zeros"], g_idx=d["g_idx"])
    np.testing.assert_array_equal(again.unpack(), p.unpack())
    assert again.nbytes == p.nbytes == moe_cpu.pack_int4(r.codes, r.scales, g, r.zeros).nbytes + E * K * 4


def test_identity_map_packs_without_a_permutation(rng):
    E, N, K, g = 2, 16, 64, 32
    gi = np.tile(np.arange(K) // g, (E, 1))
    _, p = int4_zp(rng, E, N, K, g, gi)
    assert p.form == "int4+zeros" and p.unpack_quantized()["g_idx"] is None


@A16
@pytest.mark.parametrize("M", [0, 1, 5, 70])
@pytest.mark.parametrize("which", ["w13", "w2", "both"])
def test_fused_experts_matches_reference_on_unpermuted_weights(rng, which, M, a16):
    E, k, H, I, g = 4, 2, 128, 64, 32
    s4 = schemes(a16)[0]
    g13 = act_order_map(rng, E, H, g) if which != "w2" else None
    g2 = act_order_map(rng, E, I, g) if which != "w13" else None
    r13, p13 = int4_zp(rng, E, 2 * I, H, g, g13, s4)
    r2, p2 = int4_zp(rng, E, H, I, g, g2, s4)
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    got = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    assert_close(got, ref.fused_experts_ref(x, r13, r2, tw, ids), s4, f"{which} M={M}")
    # the float64 truth of the dequantized (original order) weights: a check that does not use g_idx
    want = ref.fused_experts_float64(x, p13.unpack(), p2.unpack(), tw, ids)
    if M:   # int8 activations: a few per mille (int16: ~1e-4); a wrong channel order would be ~1
        assert np.linalg.norm(got - want) <= (1e-3 if a16 else 2e-2) * np.linalg.norm(want), which


@A16
def test_int8_act_order_and_apply_router_weight_on_input(rng, a16):
    E, k, H, I, g = 3, 2, 96, 64, 32
    s4, s8 = schemes(a16)
    q13 = rng.integers(-20, 21, (E, 2 * I, H)).astype(np.int8)
    s13 = (rng.uniform(0.5, 1.5, (E, 2 * I, H // g)) / (20 * np.sqrt(H))).astype(np.float32)
    gi = act_order_map(rng, E, H, g)
    p13 = moe_cpu.pack_int8(q13, s13, g, g_idx=gi, scheme=s8)
    r2, p2 = int4_zp(rng, E, H, I, g, act_order_map(rng, E, I, g), s4)
    x = make_input(rng, 9, H)
    tw, ids = make_routing(rng, 9, E, k)
    r13 = ref.RefWeights.int8(q13, s13, g, g_idx=gi, scheme=s8)
    for on_input in (False, True):
        got = moe_cpu.fused_experts(x, p13, p2, tw, ids, apply_router_weight_on_input=on_input)
        assert_close(got, ref.fused_experts_ref(x, r13, r2, tw, ids, apply_router_weight_on_input=on_input),
                     s4, f"on_input={on_input}")


@A16
@pytest.mark.parametrize("K", [100, 104])
def test_act_order_gather_runs_of_eight_and_channel_tail(rng, K, a16):
    # 43 rows per expert (k = E): runs of 8 rows (the channel-major gather) and 3 single rows; K = 100 leaves
    # a tail of 4 channels after the 8x8 blocks.
    E, k, I, g, M = 2, 2, 64, 20 if K == 100 else 8, 43
    q13 = rng.integers(-20, 21, (E, 2 * I, K)).astype(np.int8)
    s13 = (rng.uniform(0.5, 1.5, (E, 2 * I, K // g)) / (20 * np.sqrt(K))).astype(np.float32)
    gi = act_order_map(rng, E, K, g)
    s4, s8 = schemes(a16)
    p13 = moe_cpu.pack_int8(q13, s13, g, g_idx=gi, scheme=s8)
    r2, p2 = int4_zp(rng, E, K, I, 32, None, s4)
    x = make_input(rng, M, K)
    tw, ids = make_routing(rng, M, E, k)
    r13 = ref.RefWeights.int8(q13, s13, g, g_idx=gi, scheme=s8)
    got = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    assert_close(got, ref.fused_experts_ref(x, r13, r2, tw, ids), s4, f"K={K}")


@A16
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bitwise_equal_to_permuting_the_activations_by_hand(rng, dtype, a16):
    """One permutation for every expert: act-order packing on x equals plain packing of the sorted
    codes on x[:, perm] bit for bit (w2 likewise, through w13's output rows)."""
    E, k, H, I, g, M = 4, 2, 128, 64, 32, 33
    s4 = schemes(a16)[0]
    g13, g2 = act_order_map(rng, E, H, g, shared=True), act_order_map(rng, E, I, g, shared=True)
    r13, p13 = int4_zp(rng, E, 2 * I, H, g, g13, s4)
    r2, p2 = int4_zp(rng, E, H, I, g, g2, s4)
    x = make_input(rng, M, H, dtype)
    tw, ids = make_routing(rng, M, E, k)
    got = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    perm1, perm2 = np.argsort(g13[0], kind="stable"), np.argsort(g2[0], kind="stable")
    rows = np.concatenate([perm2, I + perm2])          # GEMM1 writes its output in w2's sorted order
    c = np.ascontiguousarray
    plain13 = moe_cpu.pack_int4(c(r13.codes[:, rows][:, :, perm1]), c(r13.scales[:, rows]), g, c(r13.zeros[:, rows]),
                                scheme=s4)
    plain2 = moe_cpu.pack_int4(np.ascontiguousarray(r2.codes[:, :, perm2]), r2.scales, g, r2.zeros, scheme=s4)
    want = moe_cpu.fused_experts(np.ascontiguousarray(x[:, perm1]), plain13, plain2, tw, ids)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


@pytest.mark.parametrize("mmap", [True, False])
def test_packed_file_round_trip(rng, tmp_path, mmap):
    E, N, K, g = 2, 24, 64, 32
    r, p = int4_zp(rng, E, N, K, g, act_order_map(rng, E, K, g))
    p.save(tmp_path / "w.moe")
    back = moe_cpu.load_packed(tmp_path / "w.moe", mmap=mmap)
    assert back.form == p.form and back.nbytes == p.nbytes
    np.testing.assert_array_equal(back.unpack(), p.unpack())
    np.testing.assert_array_equal(back.unpack_quantized()["g_idx"], p.unpack_quantized()["g_idx"])


def test_damaged_permutation_in_a_file_raises(rng, tmp_path):
    import struct
    import zlib
    E, N, K, g = 2, 16, 64, 32
    _, p = int4_zp(rng, E, N, K, g, act_order_map(rng, E, K, g))
    p.save(tmp_path / "w.moe")
    b = bytearray((tmp_path / "w.moe").read_bytes())
    off, size, _ = struct.unpack_from("<QQI", b, 184)   # the k_perm section
    assert size == E * K * 4
    struct.pack_into("<i", b, off, K + 5)               # out of range, with a matching CRC
    struct.pack_into("<I", b, 184 + 16, zlib.crc32(bytes(b[off:off + size])))
    struct.pack_into("<I", b, 252, zlib.crc32(bytes(b[:252])))
    (tmp_path / "bad.moe").write_bytes(bytes(b))
    with pytest.raises(ValueError, match="not a permutation"):
        moe_cpu.load_packed(tmp_path / "bad.moe")


@pytest.mark.parametrize("g_idx,exc,needle", [
    ("np.zeros((2, 64), np.float32)", TypeError, "g_idx must be an integer"),
    ("np.zeros((2, 63), np.int32)", ValueError, "g_idx has shape"),
    ("np.full((2, 64), 2, np.int32)", ValueError, "not a group index in [0, 2)"),
    ("np.zeros((2, 64), np.int32)", ValueError, "not a valid group map"),
])
def test_bad_g_idx_raises(g_idx, exc, needle):
    q = np.zeros((2, 8, 64), np.int8)
    s = np.ones((2, 8, 2), np.float32)
    with pytest.raises(exc, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        moe_cpu.pack_int4(q, s, 32, g_idx=eval(g_idx))
    with pytest.raises(ValueError, match="needs a group_size > 0"):
        moe_cpu.pack_int8(q, s[:, :, :1], -1, g_idx=np.zeros(64, np.int32))


def test_float_schemes_refuse_a_permutation(rng):
    p = moe_cpu._core.pack_bf16(np.zeros((1, 16, 32), np.uint16))
    assert p.form == "bf16"
    with pytest.raises(ValueError, match="not a permutation"):
        moe_cpu._core.pack_int4(np.zeros((1, 16, 32), np.int8), np.ones((1, 16, 1), np.float32), 32, None, None,
                                None, np.zeros((1, 32), np.int32))
