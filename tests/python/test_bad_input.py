"""Bad input raises ValueError / TypeError naming the argument, and never crashes.

Each case runs in its own subprocess, so a segfault or abort fails that case instead of the run.
"""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow   # subprocesses / torch / mpirun: native level only, not in `test.sh quick`

SETUP = textwrap.dedent("""
    import numpy as np, moe_cpu as mc
    rng = np.random.default_rng(0)
    E, H, I, M, k = 4, 64, 32, 3, 2
    w13f = rng.standard_normal((E, 2 * I, H)).astype(np.float32)
    w2f = rng.standard_normal((E, H, I)).astype(np.float32)
    w13 = mc.quantize_experts(w13f, "int4_w4a8", group_size=32)
    w2 = mc.quantize_experts(w2f, "int4_w4a8", group_size=32)
    w13b = mc.quantize_experts(w13f, "bf16")
    x = rng.standard_normal((M, H)).astype(np.float32)
    tw = np.full((M, k), 0.5, np.float32)
    ti = np.array([[0, 1], [2, 3], [1, 0]], np.int32)
    q4 = rng.integers(-8, 8, (E, 8, 64)).astype(np.int8)
    s4 = np.ones((E, 8, 2), np.float32)
""")

# (label, code, exception type, substrings the message must contain)
CASES = [
    ("x_rank", "mc.fused_experts(x[0], w13, w2, tw, ti)", ValueError, ["hidden_states", "2-D"]),
    ("x_float64", "mc.fused_experts(x.astype(np.float64), w13, w2, tw, ti)", TypeError, ["hidden_states", "float64"]),
    ("x_not_array", "mc.fused_experts(x.tolist(), w13, w2, tw, ti)", TypeError, ["hidden_states", "ndarray"]),
    ("x_noncontig", "mc.fused_experts(np.asfortranarray(x), w13, w2, tw, ti)", ValueError, ["hidden_states", "contiguous"]),
    ("x_nan", "x[1, 3] = np.nan; mc.fused_experts(x, w13, w2, tw, ti)", ValueError, ["hidden_states[1, 3]", "finite"]),
    ("x_wrong_H", "mc.fused_experts(np.zeros((M, 48), np.float32), w13, w2, tw, ti)", ValueError, ["H = 48"]),
    ("ids_float", "mc.fused_experts(x, w13, w2, tw, ti.astype(np.float32))", TypeError, ["topk_ids", "int32"]),
    ("ids_shape", "mc.fused_experts(x, w13, w2, tw, ti[:2])", ValueError, ["topk_ids", "[M, k]"]),
    ("weights_shape", "mc.fused_experts(x, w13, w2, tw[:, :1], ti)", ValueError, ["topk_weights"]),
    ("weights_nan", "tw[0, 1] = np.nan; mc.fused_experts(x, w13, w2, tw, ti)", ValueError, ["topk_weights[0, 1]"]),
    ("ids_out_of_range", "ti[2, 1] = 4; mc.fused_experts(x, w13, w2, tw, ti)", ValueError, ["topk_ids[2, 1] = 4", "out of range"]),
    ("k_above_E", "mc.fused_experts(x, w13, w2, np.ones((M, 5), np.float32), np.zeros((M, 5), np.int32))", ValueError, ["k = 5"]),
    ("scheme_mismatch", "mc.fused_experts(x, w13b, w2, tw, ti)", ValueError, ["w13", "w2", "same scheme"]),
    ("w13_not_packed", "mc.fused_experts(x, w13f, w2, tw, ti)", TypeError, ["w13", "PackedExperts"]),
    ("I_mismatch", "mc.fused_experts(x, w13, mc.quantize_experts(w2f[:, :, :16].copy(), 'int4_w4a8', -1), tw, ti)", ValueError, ["2 * w2 in_features"]),
    ("E_mismatch", "mc.fused_experts(x, w13, mc.quantize_experts(w2f[:2].copy(), 'int4_w4a8', 32), tw, ti)", ValueError, ["experts"]),
    ("bad_activation", "mc.fused_experts(x, w13, w2, tw, ti, activation='relu')", ValueError, ["activation", "relu"]),
    ("bias_shape", "mc.fused_experts(x, w13, w2, tw, ti, w13_bias=np.zeros((E, I), np.float32))", ValueError, ["w13_bias"]),
    ("w13_bias_nan", "b = np.zeros((E, 2 * I), np.float32); b[2, 5] = np.nan; mc.fused_experts(x, w13, w2, tw, ti, w13_bias=b)", ValueError, ["w13_bias[2, 5] = nan", "finite"]),
    ("w2_bias_inf", "b = np.zeros((E, H), np.float32); b[3, 63] = -np.inf; mc.fused_experts(x, w13b, mc.quantize_experts(w2f, 'bf16'), tw, ti, w2_bias=b)", ValueError, ["w2_bias[3, 63] = -inf", "finite"]),
    ("expert_map_value", "mc.fused_experts(x, w13, w2, tw, ti, expert_map=np.array([0, 1, 2, 9], np.int32))", ValueError, ["expert_map[3] = 9"]),
    ("expert_map_dtype", "mc.fused_experts(x, w13, w2, tw, ti, expert_map=np.arange(4))", TypeError, ["expert_map", "int32"]),
    ("out_shape", "mc.fused_experts(x, w13, w2, tw, ti, out=np.zeros((M, H + 1), np.float32))", ValueError, ["out"]),
    ("out_dtype", "mc.fused_experts(x, w13, w2, tw, ti, out=np.zeros((M, H), np.float64))", TypeError, ["out", "float32"]),
    ("out_overlaps_x", "b = np.zeros((M + 1, H), np.float32); b[:M] = x; mc.fused_experts(b[:M], w13, w2, tw, ti, out=b[1:])", ValueError, ["out shares memory with hidden_states"]),
    ("out_overlaps_weights", "b = np.zeros(M * H + M * k, np.float32); b[:M * k] = 0.5; mc.fused_experts(x, w13, w2, b[:M * k].reshape(M, k), ti, out=b[M * k - 1:-1].reshape(M, H))", ValueError, ["out shares memory with topk_weights"]),
    ("shared_out_overlaps", "b = np.zeros((M + 1, H), np.float32); mc.shared_expert(x, mc.quantize_experts(w13f[:1].copy(), 'int4_w4a8', group_size=32), mc.quantize_experts(w2f[:1].copy(), 'int4_w4a8', group_size=32), b[:M], out=b[1:])", ValueError, ["out shares memory with fused_experts_out"]),
    ("out_and_inplace", "mc.fused_experts(x, w13, w2, tw, ti, out=np.zeros_like(x), inplace=True)", ValueError, ["inplace"]),
    ("int4_range", "q4[1, 2, 3] = 8; mc.pack_int4(q4, s4, 32)", ValueError, ["qweight", "[-8, 7]"]),
    # A16: the packers' scheme names their weights; A16 pairs with A16 only
    ("pack_int4_scheme_int8", "mc.pack_int4(q4, s4, 32, scheme='int8_w8a16')", ValueError, ["pack_int4 packs int4", "'int8_w8a16'", "'int4_w4a16'"]),
    ("pack_int8_scheme_bf16", "mc.pack_int8(q4, s4, 32, scheme='bf16')", ValueError, ["pack_int8 packs int8", "'bf16'"]),
    ("pack_scheme_unknown", "mc.pack_int4(q4, s4, 32, scheme='int4_w4a4')", ValueError, ["scheme = 'int4_w4a4'", "int4_w4a16"]),
    ("pack_scheme_type", "mc.pack_int4(q4, s4, 32, scheme=16)", TypeError, ["scheme must be a str"]),
    ("a16_group", "mc.quantize_experts(w13f, 'int4_w4a16', group_size=48)", ValueError, ["group_size = 48"]),
    ("a16_with_a8", "mc.fused_experts(x, mc.quantize_experts(w13f, 'int4_w4a16', group_size=32), w2, tw, ti)", ValueError, ["int4_w4a16", "int4_w4a8", "16-bit activations"]),
    ("a16_x_inf", "x[2, 0] = np.inf; mc.fused_experts(x, mc.quantize_experts(w13f, 'int8_w8a16'), mc.quantize_experts(w2f, 'int8_w8a16'), tw, ti)", ValueError, ["hidden_states[2, 0]", "finite"]),
    ("int4_range_zp", "mc.pack_int4((q4 + 8).astype(np.uint8) * 2, s4, 32, zeros=np.zeros((E, 8, 2), np.uint8))", ValueError, ["qweight", "[0, 15]"]),
    ("int4_group_not_dividing", "mc.pack_int4(q4, np.ones((E, 8, 1), np.float32), 96)", ValueError, ["group_size = 96"]),
    ("int4_group_not_32", "mc.quantize_experts(w13f, 'int4_w4a8', group_size=16)", ValueError, ["group_size = 16"]),
    ("int4_scales_shape", "mc.pack_int4(q4, np.ones((E, 8, 3), np.float32), 32)", ValueError, ["scales"]),
    ("nan_scales", "s4[0, 0, 1] = np.nan; mc.pack_int4(q4, s4, 32)", ValueError, ["scales", "finite"]),
    ("int8_scales_float64", "mc.pack_int8(q4, np.ones((E, 8), np.float64))", TypeError, ["scales"]),
    ("fp8_nan_code", "w = np.zeros((1, 2, 2), np.uint8); w[0, 1, 1] = 0x7f; mc.pack_fp8(w, np.ones((1, 1, 1), np.float32))", ValueError, ["weight", "NaN"]),
    ("fp8_scale_shape", "mc.pack_fp8(np.zeros((1, 200, 130), np.uint8), np.ones((1, 1, 1), np.float32))", ValueError, ["scale_inv", "ceil"]),
    ("bf16_float32", "mc.pack_bf16(w13f)", TypeError, ["weight", "bfloat16"]),
    ("quantize_nan", "w13f[0, 0, 0] = np.nan; mc.quantize_experts(w13f, 'int8_w8a8')", ValueError, ["w flat index 0"]),
    ("quantize_bad_scheme", "mc.quantize_experts(w13f, 'int3')", ValueError, ["scheme", "int3"]),
    ("route_k_above_E", "mc.select_experts(np.zeros((2, 4), np.float32), 5)", ValueError, ["top_k = 5"]),
    ("route_nan", "l = np.zeros((2, 4), np.float32); l[1, 2] = np.nan; mc.select_experts(l, 2)", ValueError, ["router_logits[1, 2]"]),
    ("route_groups", "mc.select_experts(np.zeros((2, 6), np.float32), 2, use_grouped_topk=True, num_expert_group=4, topk_group=1)", ValueError, ["num_expert_group = 4"]),
    ("route_float64", "mc.select_experts(np.zeros((2, 4)), 2)", TypeError, ["router_logits", "float32"]),
    ("align_E_past_int32", "mc.moe_align_block_size(ti, 2**31, 4)", ValueError, ["num_experts = 2147483648"]),
    ("align_block_past_int32", "mc.moe_align_block_size(ti, 4, 2**40)", ValueError, ["num_tokens_post_pad", "block_size = 1099511627776", "int32"]),
    ("dyn_I2", "mc.dynamic_4bit_int_moe(x, ti, tw, w13, w2, H, I, 2 * I + 1, 32, False, 0)", ValueError, ["I2"]),
    ("dyn_kind", "mc.dynamic_4bit_int_moe(x, ti, tw, w13, w2, H, I, 2 * I, 32, False, 3)", ValueError, ["activation_kind = 3"]),
    ("dyn_group", "mc.dynamic_4bit_int_moe(x, ti, tw, w13, w2, H, I, 2 * I, 64, False, 0)", ValueError, ["group_size"]),
    ("dyn_scheme", "mc.dynamic_4bit_int_moe(x, ti, tw, w13b, w2, H, I, 2 * I, 32, False, 0)", ValueError, ["int4_w4a8"]),
    ("shared_E", "mc.shared_expert(x, w13, w2, x.copy())", ValueError, ["num_experts == 1"]),
    ("threads", "mc.set_num_threads(0)", ValueError, ["num_threads"]),
    ("threads_too_many", "mc.set_num_threads(10**6)", ValueError, ["num_threads = 1000000", "[1, "]),
    ("threads_past_int", "mc.set_num_threads(2**40)", ValueError, ["num_threads = 1099511627776"]),
    ("scratch", "mc.set_scratch_limit(0)", ValueError, ["scratch limit"]),
    ("force_isa", "mc.force_isa('avx9000')", ValueError, ["avx9000"]),
]



def _script(code: str) -> str:
    """SETUP, then `code` inside try/except that prints the exception type and message."""
    body = "\n".join("    " + line for line in code.split("; "))
    return (SETUP + "try:\n" + body + "\nexcept Exception as e:\n"
            "    print('RAISED', type(e).__name__, str(e), sep='\\t')\nelse:\n    print('NO-ERROR')\n")


@pytest.mark.parametrize("label,code,exc,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_clear_error(label, code, exc, needles, tmp_path):
    proc = subprocess.run([sys.executable, "-c", _script(code)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, f"{label}: crashed with code {proc.returncode}\n{proc.stderr[-2000:]}"
    out = proc.stdout.strip().splitlines()[-1]
    assert out.startswith("RAISED"), f"{label}: no exception raised"
    _, name, message = out.split("\t", 2)
    assert name == exc.__name__, f"{label}: raised {name}: {message}"
    for needle in needles:
        assert needle in message, f"{label}: message {message!r} lacks {needle!r}"
