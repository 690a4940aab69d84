"""Tests of moe_cpu/reference.py itself, against independent facts: ml_dtypes conversions, hand-computed
cases and the quantization rules. These need only NumPy and ml_dtypes (no C++ build)."""
import math

import ml_dtypes
import numpy as np
import pytest
from conftest import ref


def _sig(v):
    return 1.0 / (1.0 + math.exp(-v))


# ---------------------------------------------------------------- number formats
def test_e4m3fn_decode_all_256_codes_match_ml_dtypes():
    codes = np.arange(256, dtype=np.uint8)
    ours = ref.e4m3fn_to_float(codes)
    theirs = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs)                      # NaN == NaN here
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))
    assert np.isnan(ours[[0x7F, 0xFF]]).all() and np.isnan(ours).sum() == 2
    assert ours[0x7E] == 448 and ours[0xFE] == -448 and ours[0x01] == 2.0 ** -9 and ours[0x38] == 1.0


def test_e4m3fn_encode_matches_ml_dtypes():
    rng = np.random.default_rng(1)
    table = ref.e4m3fn_to_float(np.arange(0x7F, dtype=np.uint8)).astype(np.float64)
    mids = (table[1:] + table[:-1]) / 2                             # exact ties -> even code
    x = np.concatenate([
        rng.standard_normal(200_000) * np.exp2(rng.integers(-14, 9, 200_000)),
        mids, -mids, table, -table, np.nextafter(mids, 0), np.nextafter(mids, 1000)]).astype(np.float32)
    x = x[np.abs(x) <= 448]
    np.testing.assert_array_equal(ref.float_to_e4m3fn(x), x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def test_e4m3fn_encode_saturates_and_keeps_sign():
    x = np.array([448, 449, 463.9, 464, 1e6, np.inf, -1e6, -np.inf, -0.0, -1e-9, 2.0 ** -10, 3 * 2.0 ** -10],
                 np.float32)
    expect = [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x80, 0x80, 0x00, 0x02]
    np.testing.assert_array_equal(ref.float_to_e4m3fn(x), expect)
    assert ref.float_to_e4m3fn(np.float32(np.nan)) & 0x7F == 0x7F


def test_bf16_rounding_matches_ml_dtypes():
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2 ** 32, 500_000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2 ** 16, 1000, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    x = np.concatenate([bits, ties]).view(np.float32)
    x = np.concatenate([x[np.isfinite(x)], np.float32([0, -0.0, np.inf, -np.inf, 3.4028235e38, 1e-45])])
    np.testing.assert_array_equal(ref.float_to_bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(ref.bf16_round(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert np.isnan(ref.bf16_round(np.float32([np.nan, -np.nan]))).all()


def test_bf16_round_half_to_even_by_hand():
    # bf16 keeps 7 fraction bits: around 1.0 the step is 2^-7.
    x = np.float32([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20, -(1 + 2.0 ** -8)])
    np.testing.assert_array_equal(ref.bf16_round(x), np.float32([1.0, 1 + 2.0 ** -6, 1 + 2.0 ** -7, -1.0]))
    np.testing.assert_array_equal(ref.bf16_bits_to_float(np.uint16([0x3F80, 0xC000, 0x0001])),
                                  np.float32([1.0, -2.0, 2.0 ** -133]))


# ---------------------------------------------------------------- quantizers
def test_quantize_int4_half_to_even_and_zero_group():
    w = np.zeros((1, 2, 64), np.float32)
    w[0, 0, :8] = [7, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -7]             # amax 7 -> s = 1 exactly
    w[0, 1, 32:36] = [-14, 1, 3, 5]                                    # amax 14 -> s = 2: 0.5,1.5,2.5 -> 0,2,2
    q, s = ref.quantize_int4(w, 32)
    np.testing.assert_array_equal(s, np.float32([[[1, 1], [1, 2]]]))  # all-zero groups get s = 1
    np.testing.assert_array_equal(q[0, 0, :8], [7, 2, 4, -2, 0, 0, 2, -7])
    np.testing.assert_array_equal(q[0, 1, 32:36], [-7, 0, 2, 2])
    assert not q[0, 0, 8:].any() and not q[0, 1, :32].any()
    qpc, spc = ref.quantize_int4(w, -1)                                # per channel: one scale per row
    assert spc.shape == (1, 2, 1) and spc[0, 1, 0] == np.float32(2.0)


def test_quantize_int4_float32_rules_and_range():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 3, 256)).astype(np.float32)
    q, s = ref.quantize_int4(w, 128)
    wg = w.reshape(2, 3, 2, 128)
    np.testing.assert_array_equal(s, np.abs(wg).max(-1) / np.float32(7))
    assert s.dtype == np.float32 and q.dtype == np.int8 and q.min() >= -8 and q.max() <= 7
    np.testing.assert_array_equal(q.reshape(wg.shape), np.rint(wg / s[..., None]))


def test_quantize_int8_rules():
    w = np.zeros((1, 2, 5), np.float32)
    w[0, 0] = [127, 0.5, 1.5, -2.5, -127]
    q, s = ref.quantize_int8(w)
    np.testing.assert_array_equal(s, np.float32([[[1], [1]]]))
    np.testing.assert_array_equal(q[0, 0], [127, 0, 2, -2, -127])
    assert not q[0, 1].any()


def test_quantize_int4_zero_points_roundtrip():
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((2, 4, 64)) + 0.7).astype(np.float32)    # asymmetric data
    q, s, z = ref.quantize_int4_zp(w, 32)
    assert q.dtype == np.uint8 and q.max() <= 15 and z.max() <= 15
    deq = ref.RefWeights.int4(q, s, 32, z).dequantize()
    assert np.abs(deq - w).max() <= 0.5 * s.max() * (1 + 1e-6)


def test_quantize_fp8_edge_blocks():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 70, 45)).astype(np.float32)
    w[1, 64:, 32:] = 0                                                  # an all-zero edge block
    codes, s = ref.quantize_fp8(w, (32, 32))
    assert codes.shape == w.shape and s.shape == (2, 3, 2)
    assert s[0, 2, 1] == np.abs(w[0, 64:, 32:]).max() / np.float32(448)
    assert s[1, 2, 1] == 1.0 and not (codes[1, 64:, 32:] & 0x7F).any()
    np.testing.assert_array_equal(codes[0, :32, :32], ref.float_to_e4m3fn(w[0, :32, :32] / s[0, 0, 0]))
    deq = ref.RefWeights.fp8(codes, s, (32, 32)).dequantize()
    assert np.abs(deq - w).max() <= np.abs(w).max() / 16                # 3 mantissa bits


def test_quantize_activations_int8_rules():
    x = np.float32([[127, 63.5, -63.5, 62.5, -0.5, 1.5], [0, 0, 0, 0, 0, 0], [-2, 1, 0, 0, 0, 0]])
    q, s = ref.quantize_activations_int8(x)
    np.testing.assert_array_equal(s, np.float32([1, 1, np.float32(2) / np.float32(127)]))
    np.testing.assert_array_equal(q[0], [127, 64, -64, 62, 0, 2])
    np.testing.assert_array_equal(q[1], 0)
    np.testing.assert_array_equal(q[2, :2], [-127, 64])                 # 63.5 -> 64 (even)


def test_refweights_dequantize_by_hand():
    q = np.array([[[3, 15, 0, 8]]], np.uint8)
    w = ref.RefWeights.int4(q, np.float32([[[0.5]]]), -1, zeros=np.uint8([[[8]]]))
    np.testing.assert_array_equal(w.dequantize(), [[[-2.5, 3.5, -4.0, 0.0]]])
    w8 = ref.RefWeights.int8(np.int8([[[-128, 5]]]), np.float32([[0.25]]))
    np.testing.assert_array_equal(w8.dequantize(), [[[-32.0, 1.25]]])
    wf = ref.RefWeights.fp8(np.uint8([[[0x38, 0xC0]]]), np.float32([[[0.5]]]))  # 1.0, -2.0
    np.testing.assert_array_equal(wf.dequantize(), [[[0.5, -1.0]]])
    wb = ref.RefWeights.bf16(np.uint16([[[0x3F80, 0x4040]]]))                    # 1.0, 3.0
    np.testing.assert_array_equal(wb.dequantize(), [[[1.0, 3.0]]])


# ---------------------------------------------------------------- activations
def test_activations_by_hand():
    y = np.array([[1.0, 2.0]])                                          # g = 1, u = 2
    assert ref.activation_ref(y, "silu")[0, 0] == pytest.approx(2 * _sig(1), rel=1e-15)
    assert ref.activation_ref(y, "gelu")[0, 0] == pytest.approx(2 * 0.8413447460685429, rel=1e-15)
    assert ref.activation_ref(y, "gelu_tanh")[0, 0] == pytest.approx(2 * 0.8411919906082768, rel=1e-15)
    # swiglustep: min(silu(10), 7) * clamp(9, -7, 7) = 49
    assert ref.activation_ref(np.array([[10.0, 9.0]]), "swiglustep")[0, 0] == pytest.approx(49.0)
    # swigluoai interleaved [g0, u0, g1, u1] = [1, 2, 10, -9]: (2+1)*1*sig(1.702), (-7+1)*7*sig(1.702*7)
    expect = [2.537387297798464, -41.99971876981991]
    np.testing.assert_allclose(ref.activation_ref(np.array([[1.0, 2.0, 10.0, -9.0]]), "swigluoai")[0], expect,
                               rtol=1e-14)
    np.testing.assert_allclose(
        ref.activation_ref(np.array([[1.0, 10.0, 2.0, -9.0]]), "swigluoai_uninterleave")[0], expect, rtol=1e-14)


# ---------------------------------------------------------------- fused experts by hand
def test_fused_int8_one_token_one_expert_by_hand():
    # x = [127, -64]: amax 127 -> s = 1, codes equal x. gate = (127*1 - 64*2)*0.5 = -0.5,
    # up = (-127 - 64)*0.25 = -47.75, h = silu(-0.5)*(-47.75) = 9.01378... (one element -> code 127).
    # w2 = [[2]*1.0, [-3]*0.5] -> [2h, -1.5h]; router weight 0.5 -> [h, -0.75h].
    w13 = ref.RefWeights.int8(np.int8([[[1, 2], [-1, 1]]]), np.float32([[0.5, 0.25]]))
    w2 = ref.RefWeights.int8(np.int8([[[2], [-3]]]), np.float32([[1.0, 0.5]]))
    out = ref.fused_experts_ref(np.float32([[127, -64]]), w13, w2, np.float32([[0.5]]), np.int32([[0]]))
    h = 9.013783467555722
    np.testing.assert_allclose(out, [[h, -0.75 * h]], rtol=1e-6)


def test_fused_bf16_one_token_by_hand():
    # g = 1, u = 2 -> h = 2*sigmoid(1) = 1.46211..., rounded to bf16 = 187/128 = 1.4609375.
    w13 = ref.RefWeights.bf16(ref.float_to_bf16_bits(np.float32([[[1, 0], [0, 1]]])))
    w2 = ref.RefWeights.bf16(ref.float_to_bf16_bits(np.float32([[[1], [-0.5]]])))
    out = ref.fused_experts_ref(np.float32([[1, 2]]), w13, w2, np.float32([[1.0]]), np.int32([[0]]))
    np.testing.assert_array_equal(out, [[1.4609375, -0.73046875]])


def test_fused_fp8_block_scales_by_hand():
    # K = 2 with bk = 1: each input column has its own block scale. Codes 0x38 = 1.0, 0x40 = 2.0.
    # x = [1, 1]: gate = 1*0.5 + 2*0.25 = 1.0, up = 2*0.5 + 0*0.25 = 1.0, h = bf16(silu(1) * 1);
    # w2 = 1.0 * 4.0 -> out = 4h.
    w13 = ref.RefWeights.fp8(np.uint8([[[0x38, 0x40], [0x40, 0x00]]]), np.float32([[[0.5, 0.25]]]), (2, 1))
    w2 = ref.RefWeights.fp8(np.uint8([[[0x38]]]), np.float32([[[4.0]]]), (128, 128))
    out = ref.fused_experts_ref(np.float32([[1, 1]]), w13, w2, np.float32([[1.0]]), np.int32([[0]]))
    h = float(ref.bf16_round(np.float32(_sig(1.0))))                     # silu(1) * 1
    np.testing.assert_array_equal(out, [[4.0 * h]])


def test_fused_skips_negative_ids_and_maps_experts():
    rng = np.random.default_rng(6)
    E, H, I, M = 3, 32, 32, 4
    w13f = (rng.standard_normal((E, 2 * I, H)) / 6).astype(np.float32)
    w2f = (rng.standard_normal((E, H, I)) / 6).astype(np.float32)
    w13, w2 = ref.RefWeights.quantize(w13f, "int8_w8a8"), ref.RefWeights.quantize(w2f, "int8_w8a8")
    x = rng.standard_normal((M, H)).astype(np.float32)
    tw = np.float32([[0.5, 0.25]] * M)
    ids = np.int32([[0, 2], [-1, 1], [-1, -1], [1, 1]])
    out = ref.fused_experts_ref(x, w13, w2, tw, ids)
    assert not out[2].any()                                             # only -1 ids -> zero row
    single = ref.fused_experts_ref(x, w13, w2, np.float32([[1.0]] * M), np.int32([[0], [1], [1], [1]]))
    np.testing.assert_allclose(out[1], 0.25 * single[1], rtol=1e-12)
    np.testing.assert_allclose(out[3], 0.75 * single[3], rtol=1e-12)    # duplicate ids add up
    emap = np.int32([-1, 2, 0, -1, 1])                                  # global 1->2, 2->0, 4->1
    gids = np.int32([[2, 1], [-1, 4], [0, 3], [4, 4]])
    np.testing.assert_array_equal(ref.fused_experts_ref(x, w13, w2, tw, gids, expert_map=emap), out)
    with pytest.raises(ValueError):
        ref.fused_experts_ref(x, w13, w2, tw, np.int32([[0, 3]] * M))


def test_fused_float64_matches_plain_numpy():
    rng = np.random.default_rng(7)
    E, H, I, M, k = 4, 24, 10, 5, 2
    w13 = rng.standard_normal((E, 2 * I, H))
    w2 = rng.standard_normal((E, H, I))
    b13, b2 = rng.standard_normal((E, 2 * I)).astype(np.float32), rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((M, H)).astype(np.float32)
    tw = rng.random((M, k)).astype(np.float32)
    ids = np.int32([[0, 1], [3, 3], [2, -1], [1, 0], [0, 2]])
    expect = np.zeros((M, H))
    for m in range(M):
        for j in range(k):
            e = ids[m, j]
            if e < 0:
                continue
            y = w13[e] @ x[m].astype(np.float64) + b13[e]
            g, u = y[:I], y[I:]
            expect[m] += float(tw[m, j]) * (w2[e] @ (g / (1 + np.exp(-g)) * u) + b2[e])
    got = ref.fused_experts_float64(x, w13, w2, tw, ids, w13_bias=b13, w2_bias=b2)
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


def test_router_weight_on_input_scales_the_row_in_float32():
    # bf16 weights chosen exactly representable; weight 0.5 on the input halves x exactly.
    rng = np.random.default_rng(8)
    bits = ref.float_to_bf16_bits(rng.standard_normal((1, 8, 4)).astype(np.float32))
    w13, w2 = ref.RefWeights.bf16(bits), ref.RefWeights.bf16(bits[:, :4, :4].copy())
    x = rng.standard_normal((2, 4)).astype(np.float32)
    on = ref.fused_experts_ref(x, w13, w2, np.float32([[0.5], [0.5]]), np.int32([[0], [0]]),
                               apply_router_weight_on_input=True)
    np.testing.assert_array_equal(on, ref.fused_experts_ref(x * np.float32(0.5), w13, w2,
                                                            np.float32([[1], [1]]), np.int32([[0], [0]])))


@pytest.mark.parametrize("scheme,group,limit", [("int4_w4a8", 128, 0.25), ("int8_w8a8", None, 0.05),
                                                ("fp8_w8a16", None, 0.06), ("bf16", None, 0.01)])
def test_reference_quantization_quality(scheme, group, limit):
    # Relative L2 error of the quantized reference vs the float64 truth on Gaussian data. Measured with
    # seeds 0-3 and 9: int4 g128 0.200-0.213, int8 0.022-0.023, fp8 0.046-0.047, bf16 0.004.
    rng = np.random.default_rng(9)
    E, H, I, M, k = 8, 512, 256, 32, 2
    x = rng.standard_normal((M, H)).astype(np.float32)
    w13f = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32)
    w2f = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
    tw, ids = ref.select_experts_ref(rng.standard_normal((M, E)).astype(np.float32), k, renormalize=True)
    truth = ref.fused_experts_float64(x, w13f, w2f, tw, ids)
    out = ref.fused_experts_ref(x, ref.RefWeights.quantize(w13f, scheme, group),
                                ref.RefWeights.quantize(w2f, scheme, group), tw, ids)
    rel = np.linalg.norm(out - truth) / np.linalg.norm(truth)
    print(f"reference {scheme}: relative L2 error {rel:.4f}")
    assert 0 < rel < limit


# ---------------------------------------------------------------- routing and alignment by hand
def test_select_experts_ref_by_hand():
    logits = np.float32([[1, 2, 3, 0]])
    w, ids = ref.select_experts_ref(logits, 2)
    np.testing.assert_array_equal(ids, [[2, 1]])
    # e^3 / (1 + e + e^2 + e^3), e^2 / (...)
    np.testing.assert_allclose(w, [[0.6439142598879722, 0.23688281808991013]], rtol=1e-7)
    w, _ = ref.select_experts_ref(logits, 2, renormalize=True)
    np.testing.assert_allclose(w, [[0.7310585786300049, 0.2689414213699951]], rtol=1e-7)
    w, ids = ref.select_experts_ref(np.float32([[0, 1, -1, 2]]), 2, scoring_func="sigmoid", renormalize=True,
                                    routed_scaling_factor=2.0)
    np.testing.assert_array_equal(ids, [[3, 1]])
    np.testing.assert_allclose(w, [[2 * 0.5464491031607007, 2 * 0.4535508968392993]], rtol=1e-7)
    _, ids = ref.select_experts_ref(np.float32([[1, 3, 3, 0, 3]]), 3)   # ties -> lower index first
    np.testing.assert_array_equal(ids, [[1, 2, 4]])


def test_select_experts_ref_grouped_by_hand():
    # 4 groups of 2. Without bias a group scores its max: groups 0 (3.0) and 1 (2.9) -> ids [1, 2].
    # With a (zero) bias a group scores the sum of its top 2 sigmoids: groups 1 (1.89) and 3 (1.46)
    # win, and the best two inside are ids 2 and 3.
    logits = np.float32([[0.0, 3.0, 2.9, 2.8, 2.5, -1.0, 1.0, 1.0]])
    kw = dict(scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=4, topk_group=2)
    w, ids = ref.select_experts_ref(logits, 2, **kw)
    np.testing.assert_array_equal(ids, [[1, 2]])
    np.testing.assert_allclose(w, [[_sig(3.0), _sig(2.9)]], rtol=1e-6)
    w, ids = ref.select_experts_ref(logits, 2, e_score_correction_bias=np.zeros(8, np.float32),
                                    routed_scaling_factor=2.5, **kw)
    np.testing.assert_array_equal(ids, [[2, 3]])
    np.testing.assert_allclose(w, [[2.5 * 0.9478464369215823, 2.5 * 0.9426758241011313]], rtol=1e-6)


def test_moe_align_block_size_ref_by_hand():
    ids = np.int32([[2, 0], [2, -1], [0, 2]])        # slots 0..5; pad value M*k = 6
    sorted_ids, expert_ids, n = ref.moe_align_block_size_ref(ids, 3, 2)
    np.testing.assert_array_equal(sorted_ids, [1, 4, 0, 2, 5, 6])   # expert 0: slots 1, 4; expert 2: 0, 2, 5
    np.testing.assert_array_equal(expert_ids, [0, 2, 2])
    assert n == 6
