"""The checkpoint weight forms: int4 codebooks, float group offsets (mins), int8 with group 16, and
w13 / w2 in different int forms. Packed weights must unpack to exactly value * scale - min (float32),
and fused_experts must match moe_cpu/reference.py on the same codes."""
import struct
import zlib

import numpy as np
import pytest

import moe_cpu
from moe_cpu.bench.peaks import kernel_isa
from conftest import SPLIT_CODE_KERNELS, assert_close, make_input, make_routing, ref
from moe_cpu.reference import fused_experts_float64

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

IQ4_NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
UNSIGNED = tuple(range(16))
# A signed codebook at both int8 ends: -128 (whose negation wraps) and +127.
SIGNED128 = (-128,) + IQ4_NL[1:15] + (127,)


def kquant_mins(rng, E, N, G):
    """Mins as Q4_K / Q5_K hold them: an fp16 dmin per run of 8 groups times 6-bit integers."""
    runs = -(-G // 8)
    d = (rng.uniform(0.2, 1.0, (E, N, runs, 1)) / (4 * np.sqrt(32 * G))).astype(np.float16).astype(np.float32)
    return np.ascontiguousarray((d * rng.integers(0, 64, (E, N, runs, 8))).reshape(E, N, -1)[:, :, :G], np.float32)


def kquant_scales(rng, E, N, G, lo, hi, K):
    """Scales as Q4_K (lo, hi = 0, 63) and IQ4_XS (-32, 31) hold them: an fp16 d per run of 8 groups times
    integers; every third run's integers all zero, and every fifth d zero (IQ4_XS: -0 and +0 scales)."""
    runs = -(-G // 8)
    d = (rng.uniform(0.5, 1.5, (E, N, runs, 1)) / (4 * max(abs(lo), hi) * np.sqrt(K))).astype(np.float16).astype(np.float32)
    d.reshape(-1)[::5] = 0
    sc = rng.integers(lo, hi + 1, (E, N, runs, 8)).astype(np.float32)
    sc[:, :, 2::3] = 0
    return np.ascontiguousarray((d * sc).reshape(E, N, -1)[:, :, :G], np.float32)


def form_weights(rng, form, E, N, K, a16=False, group=None, top=False):
    """(RefWeights, PackedExperts) of random codes in a GGUF-like form, outputs of unit scale; a16: run them
    with 16-bit activations (int4_w4a16 / int8_w8a16); int8 forms: group overrides the group length, top puts
    every code but one (at the bottom) at the top of its range."""
    if form in ("iq4nl", "mxfp4", "q4k", "q4k_dmin", "q4k_ks", "iq4xs"):
        cb = {"iq4nl": IQ4_NL, "mxfp4": MXFP4, "iq4xs": IQ4_NL}.get(form, UNSIGNED)
        g, G = 32, K // 32
        q = rng.integers(0, 16, (E, N, K)).astype(np.uint8)
        if form in ("q4k_ks", "iq4xs"):   # d * int per run of 8 groups, as the files hold them
            s = kquant_scales(rng, E, N, G, *((0, 63) if form == "q4k_ks" else (-32, 31)), K)
        elif form == "mxfp4":   # power-of-two scales, as MXFP4's e8m0 bytes give
            s = np.ldexp(np.float32(1), rng.integers(-3, 0, (E, N, G)) - int(np.log2(np.sqrt(K)) + 2)).astype(np.float32)
        else:
            s = (rng.uniform(0.5, 1.5, (E, N, G)) / ((60 if form == "iq4nl" else 8) * np.sqrt(K))).astype(np.float32)
        m = (s * rng.uniform(0, 15, (E, N, G))).astype(np.float32) if form == "q4k" else None
        m = kquant_mins(rng, E, N, G) if form in ("q4k_dmin", "q4k_ks") else m
        sch = "int4_w4a16" if a16 else "int4_w4a8"
        return (ref.RefWeights.int4(q, s, g, codebook=cb, mins=m, scheme=sch),
                moe_cpu.pack_int4(q, s, g, codebook=cb, mins=m, scheme=sch))
    g = group or (16 if form.startswith(("q6k", "q2k", "q3k")) else 32)
    lo, hi = {"q6k": (-32, 31), "q2k": (0, 3), "q3k": (-4, 3)}.get(form[:3], (0, 31))
    q = np.full((E, N, K), hi, np.int8) if top else rng.integers(lo, hi + 1, (E, N, K)).astype(np.int8)
    if top:
        q[0, 0, 0] = lo   # one code at the bottom keeps the codes' span
    s = (rng.uniform(0.5, 1.5, (E, N, K // g)) / (20 * np.sqrt(K))).astype(np.float32)
    if form in ("q6k_ks", "q5k_ks", "q2k_ks", "q3k_ks"):   # d * int per 16 or 32 (a d per run of 8 groups)
        span = {"q6k_ks": (-128, 127), "q2k_ks": (0, 15), "q3k_ks": (-32, 31)}.get(form, (0, 63))
        s = kquant_scales(rng, E, N, K // g, *span, K) * 32
    m = (s * rng.uniform(0, 31, s.shape)).astype(np.float32) if form == "q5k" else None
    m = kquant_mins(rng, E, N, K // g) if form in ("q5k_dmin", "q5k_ks") or form.startswith("q2k") else m
    sch = "int8_w8a16" if a16 else "int8_w8a8"
    return ref.RefWeights.int8(q, s, g, mins=m, scheme=sch), moe_cpu.pack_int8(q, s, g, mins=m, scheme=sch)


FORMS = ["iq4nl", "mxfp4", "q4k", "q6k", "q5k", "q4k_dmin", "q5k_dmin", "q4k_ks", "iq4xs"]


@pytest.mark.parametrize("form", FORMS)
def test_unpack_is_value_times_scale_minus_min(rng, form):
    r, p = form_weights(rng, form, 2, 48, 128)
    d = p.unpack_quantized()
    g = r.group
    value = r.codebook[r.codes.astype(np.int64)] if r.codebook is not None else r.codes
    want = value.astype(np.float32) * np.repeat(r.scales, g, axis=2)
    if r.mins is not None:
        want = want - np.repeat(r.mins, g, axis=2)
    assert p.unpack().dtype == np.float32
    np.testing.assert_array_equal(p.unpack(), want)
    np.testing.assert_array_equal(d["qweight"], r.codes)
    np.testing.assert_array_equal(d["scales"], r.scales)
    assert (d["mins"] is None) == (r.mins is None)
    if r.mins is not None:
        np.testing.assert_array_equal(d["mins"], r.mins)
    assert p.has_mins == (r.mins is not None)
    if p.scheme == "int4_w4a8":
        np.testing.assert_array_equal(p.codebook, r.codebook)
        assert p.form == "int4+codebook" + ("+mins" if r.mins is not None else "")
    else:
        assert p.codebook is None and p.form == "int8" + ("+mins" if r.mins is not None else "")
    assert f"form={p.form}" in repr(p)


PAIRS = [("iq4nl", "iq4nl"), ("mxfp4", "mxfp4"), ("q4k", "q6k"), ("q5k", "q6k"), ("q6k", "q4k"), ("iq4nl", "q5k"),
         ("q4k_dmin", "q6k"), ("q5k_dmin", "q4k_dmin"), ("q4k_ks", "q6k"), ("iq4xs", "q4k_ks")]


@pytest.mark.parametrize("a16", [False, True], ids=["a8", "a16"])
@pytest.mark.parametrize("M", [0, 1, 3, 257])
@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_fused_experts_matches_reference(rng, pair, M, a16):
    E, k, H, I = 4, 2, 96, 64
    r13, p13 = form_weights(rng, pair[0], E, 2 * I, H, a16)
    r2, p2 = form_weights(rng, pair[1], E, H, I, a16)
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    got = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    want = ref.fused_experts_ref(x, r13, r2, tw, ids)
    # the looser of the two int tolerances of the activations' kind
    assert_close(got, want, "int4_w4a16" if a16 else "int4_w4a8", f"{pair} M={M}")


@pytest.mark.parametrize("sign", [1, -1], ids=["x+", "x-"])
@pytest.mark.parametrize("act_block", [None, 32])
@pytest.mark.parametrize("M", [1, 3, 9])
@pytest.mark.parametrize("codebook,code", [(MXFP4, 7), (MXFP4, 15), (IQ4_NL, 15), (IQ4_NL, 0), (UNSIGNED, 15),
                                           (SIGNED128, 0), (SIGNED128, 15)],
                         ids=["mxfp4+12", "mxfp4-12", "iq4nl+113", "iq4nl-127", "unsigned15", "cb-128", "cb+127"])
def test_largest_codes_times_largest_activations(rng, codebook, code, M, act_block, sign):
    """Every code of w13 at one extreme codebook value and every activation at +127 or -127 (one value per row):
    the products of a group all have the largest size and one sign, so any int16 partial sum that could wrap shows
    (the vpmaddubsw kernel summed 16 MXFP4 table bytes of 24 in int16, 48768 > 32767: a relative error of 1), and
    so would a negated -128 (the AVX2 decode moves the activation's sign onto the codebook value, except for a
    codebook holding -128)."""
    E, H, I = 2, 128, 32
    q = np.full((E, 2 * I, H), code, np.uint8)
    s = np.full((E, 2 * I, H // 32), 1 / (16 * H), np.float32)
    w13 = moe_cpu.pack_int4(q, s, 32, codebook=codebook, act_block=act_block)
    w2 = moe_cpu.quantize_experts(rng.standard_normal((E, H, I)).astype(np.float32), "int8_w8a8", act_block=act_block)
    x = np.full((M, H), sign, np.float32)
    tw, ids = np.ones((M, 1), np.float32), np.zeros((M, 1), np.int32)
    got = moe_cpu.fused_experts(x, w13, w2, tw, ids)
    want = fused_experts_float64(x, w13.unpack(), w2.unpack(), tw, ids, "silu")
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), f"{np.abs(got - want).max()} vs {np.abs(want).max()}"


@pytest.mark.parametrize("sign", [1, -1], ids=["x+", "x-"])
@pytest.mark.parametrize("act_block", [None, 256])
@pytest.mark.parametrize("M", [1, 9])
@pytest.mark.parametrize("codebook,code,top", [(UNSIGNED, 15, 127), (IQ4_NL, 0, -128), (SIGNED128, 0, -128),
                                               (SIGNED128, 15, 127), ((0, 31), 31, 127), ((0, 31), 31, -128),
                                               ((-32, 31), 31, -128), ((-32, 31), -32, 127)],
                         ids=["unsigned15", "iq4nl-127", "cb-128", "cb+127", "5bit31+127", "5bit31-128", "6bit31-128",
                              "6bit-32+127"])
def test_integer_scales_at_their_largest_sums(rng, codebook, code, top, M, act_block, sign):
    """Integer scales as the K-quants and IQ4_XS hold them (an fp16 d per run of 8 groups times int8) at the int8
    ends, every code at one extreme (int8 codes in a 5- or 6-bit range, given as (low, high): the AVX2 split forms of
    Q5_K and Q6_K, the latter with a zero point) and every activation at +-127: where one activation scale covers a
    run (per token, blocks of 256) the AVX2 kernels sum the run's scale * dot in int32, and a wrapped sum shows here.
    The decode row (M = 1) and the row tiles (M = 9) both."""
    E, H, I = 2, 512, 32
    q = np.full((E, 2 * I, H), code, np.int8 if len(codebook) == 2 else np.uint8)
    ints = np.full((E, 2 * I, H // 32), top, np.float32)
    ints[:, :, ::8] = 1                  # each run's smallest: d is 2^-20 and the others' integers stay at the top
    if len(codebook) == 2:               # int8: one code at the range's other end sets the split form's zero point
        q[0, 0, 0] = codebook[0] if code == codebook[1] else codebook[1]
        w13 = moe_cpu.pack_int8(q, ints * np.float32(2.0 ** -20), 32, act_block=act_block)
    else:
        w13 = moe_cpu.pack_int4(q, ints * np.float32(2.0 ** -20), 32, codebook=codebook, act_block=act_block)
    if kernel_isa(w13.kernel) == "avx2":   # the tier whose runs this checks holds the scales as integers
        assert w13.has_int_scales
    w2 = moe_cpu.quantize_experts(rng.standard_normal((E, H, I)).astype(np.float32), "int8_w8a8")
    x = np.full((M, H), sign, np.float32)
    tw, ids = np.ones((M, 1), np.float32), np.zeros((M, 1), np.int32)
    got = moe_cpu.fused_experts(x, w13, w2, tw, ids)
    want = fused_experts_float64(x, w13.unpack(), w2.unpack(), tw, ids, "silu")
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), f"{np.abs(got - want).max()} vs {np.abs(want).max()}"


@pytest.mark.parametrize("act_block", [None, 256])
@pytest.mark.parametrize("forms", [("q4k_ks", "q4k_ks"), ("q5k_ks", "q5k_ks"), ("q6k_ks", "q6k_ks"), ("iq4xs", "iq4xs")],
                         ids=["q4k", "q5k", "q6k", "iq4xs"])
def test_integer_scale_runs_give_a_row_the_same_bits_alone(rng, forms, act_block):
    """Integer scales with one activation scale per run of 8 groups (per token, blocks of 256; on AVX2 a run's scaled
    dots summed in int32): a row's output has the same bits alone (the decode kernels) as among others (the row
    tiles), against the reference too; w13's K of 10 groups has a whole run and a short one."""
    E, k, H, I, M = 3, 2, 320, 256, 21
    pair = []
    for form, (N, K) in zip(forms, ((2 * I, H), (H, I))):
        r, _ = form_weights(rng, form, E, N, K)
        kw = dict(mins=r.mins, act_block=act_block if act_block is None or K % act_block == 0 else None)
        if r.codebook is None:
            pair.append((ref.RefWeights.int8(r.codes, r.scales, r.group, **kw),
                         moe_cpu.pack_int8(r.codes, r.scales, r.group, **kw)))
        else:
            kw["codebook"] = r.codebook.astype(np.int8)
            pair.append((ref.RefWeights.int4(r.codes, r.scales, 32, **kw), moe_cpu.pack_int4(r.codes, r.scales, 32, **kw)))
    (r13, p13), (r2, p2) = pair
    if kernel_isa(p13.kernel) == "avx2":
        assert p13.has_int_scales
    bits = {"q5k_ks": 5, "q6k_ks": 6}.get(forms[0], 4)
    assert p13.code_bits == (bits if bits == 4 or split_code_kernel(p13) else 8)
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    many = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    assert_close(many, ref.fused_experts_ref(x, r13, r2, tw, ids), "int4_w4a8", f"{forms} B={act_block}")
    for m in range(M):
        np.testing.assert_array_equal(moe_cpu.fused_experts(x[m:m + 1], p13, p2, tw[m:m + 1], ids[m:m + 1])[0], many[m])


@pytest.mark.parametrize("a16_13", [False, True])
def test_a16_pairs_with_a16_only(rng, a16_13):
    """int4 / int8 weights pair in any way with the same activations; A16 with A8 is refused, naming both."""
    r13, p13 = form_weights(rng, "q4k", 2, 64, 64, a16_13)
    r2, p2 = form_weights(rng, "q6k", 2, 64, 32, not a16_13)
    x = make_input(rng, 3, 64)
    tw, ids = make_routing(rng, 3, 2, 1)
    with pytest.raises(ValueError, match="one keeps 16-bit activations, the other quantizes them to int8"):
        moe_cpu.fused_experts(x, p13, p2, tw, ids)
    with pytest.raises(ValueError, match=f"w13 is {r13.scheme} but w2 is {r2.scheme}"):
        ref.fused_experts_ref(x, r13, r2, tw, ids)
    with pytest.raises(ValueError, match="both must use the same scheme"):
        moe_cpu.MoELayer(np.ones((2, 64), np.float32), p13, p2, top_k=1)


@pytest.mark.parametrize("E,k", [(1, 1), (3, 3)])
def test_one_expert_and_k_equal_to_e(rng, E, k):
    H, I = 64, 32
    r13, p13 = form_weights(rng, "q4k", E, 2 * I, H)
    r2, p2 = form_weights(rng, "q6k", E, H, I)
    x = make_input(rng, 5, H)
    tw, ids = make_routing(rng, 5, E, k)
    assert_close(moe_cpu.fused_experts(x, p13, p2, tw, ids), ref.fused_experts_ref(x, r13, r2, tw, ids), "int4_w4a8")


def int_form_kernel(p):
    """Whether p's kernel takes the integer K-quant forms: the x86 int4 kernels, int8 on AVX-512 VNNI and AMX, the
    reference, and int8 split codes (the AVX2 kernel's 5- / 6-bit form)."""
    isa = kernel_isa(p.kernel)
    amx = ("amx", "amx_model")
    int4 = p.scheme == "int4_w4a8"
    return isa in (("avx512vnni", "avx2", "avx2vnni", "reference") + amx if int4 else ("avx512vnni", "reference") + amx) or \
        (not int4 and p.code_bits in (2, 4, 5, 6))


@pytest.mark.parametrize("form", ["q4k_dmin", "q5k_dmin", "q4k", "q5k"])
def test_kquant_mins_run_as_integers_on_x86(rng, tmp_path, form):
    # 10 groups: a whole run of 8 and a zero-padded one; mins that factor as dmin * int go integer
    # on the x86 int4 kernels and int8 on AVX-512 VNNI (the float mins of q4k / q5k do not factor), exact
    # either way.
    E, k, H, I = 3, 2, 320, 64
    r13, p13 = form_weights(rng, form, E, 2 * I, H)
    r2, p2 = form_weights(rng, "q6k", E, H, I)
    assert p13.has_int_mins == (form.endswith("_dmin") and int_form_kernel(p13))
    np.testing.assert_array_equal(p13.unpack_quantized()["mins"], r13.mins)
    check_layer_and_file(rng, tmp_path, (r13, p13), (r2, p2), k, form)


def check_layer_and_file(rng, tmp_path, w13, w2, k, form):
    """fused_experts on (w13, w2) against the reference, then w13 through a file: the same integer forms,
    bytes (and code bits), values and outputs."""
    (r13, p13), (r2, p2) = w13, w2
    x = make_input(rng, 37, p13.in_features)
    tw, ids = make_routing(rng, 37, p13.num_experts, k)
    out = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    assert_close(out, ref.fused_experts_ref(x, r13, r2, tw, ids), "int4_w4a8", form)
    p13.save(tmp_path / "w.moe")
    back = moe_cpu.load_packed(tmp_path / "w.moe")
    assert (back.has_int_mins, back.has_int_scales, back.has_int_nibbles, back.code_bits, back.nbytes) == \
        (p13.has_int_mins, p13.has_int_scales, p13.has_int_nibbles, p13.code_bits, p13.nbytes)
    np.testing.assert_array_equal(back.unpack(), p13.unpack())
    np.testing.assert_array_equal(moe_cpu.fused_experts(x, back, p2, tw, ids), out)


def int_scale_kernel(p):
    """Whether p's kernel takes integer scales: the x86 int kernels (AMX: int4 only) and the reference."""
    isa = kernel_isa(p.kernel)
    return isa in ("avx512vnni", "avx2", "avx2vnni", "reference") or (isa in ("amx", "amx_model") and p.scheme == "int4_w4a8")


@pytest.mark.parametrize("form", ["q4k_ks", "iq4xs", "q4k_dmin", "mxfp4", "q6k_ks", "q5k_ks"])
def test_kquant_scales_run_as_integers_on_x86(rng, tmp_path, form):
    # 10 groups: a whole run of 8 and a short one. Scales that factor as d * int8 per run (Q4_K, IQ4_XS, Q6_K, Q5_K)
    # (and MXFP4 runs whose exponents span less than 2^7) go integer on the x86 int4 kernels and shrink
    # the weights; the others stay float. Exact either way.
    E, k, H, I = 3, 2, 320, 64
    r13, p13 = form_weights(rng, form, E, 2 * I, H)
    r2, p2 = form_weights(rng, "iq4xs" if form != "iq4xs" else "q4k_ks", E, H, I)
    integer = form in ("q4k_ks", "iq4xs", "mxfp4", "q6k_ks", "q5k_ks") and int_scale_kernel(p13)  # mxfp4: 2^e, e within 3
    assert p13.has_int_scales == integer
    assert "has_int_scales" in dir(p13)
    bits = lambda a: np.ascontiguousarray(a, np.float32).view(np.uint32)
    np.testing.assert_array_equal(bits(p13.unpack_quantized()["scales"]), bits(r13.scales))   # signed zeros too
    if form == "iq4xs":
        assert (np.signbit(r13.scales) & (r13.scales == 0)).any() and ((r13.scales == 0) & ~np.signbit(r13.scales)).any()
    if integer:   # an int8 per (column, group) and an fp16 d per run of 8 groups (int4 / Q5_K: 10 groups, 2 runs, padded)
        NB, G = 2 * I // 16, H // p13.group_size
        runs = -(-G // 8)
        code_bytes = E * NB * 16 * H * p13.code_bits // 8   # int4, int8, or split 5- / 6-bit int8 codes
        scale_bytes = E * NB * 16 * (runs * 8 * 1 + runs * 2)
        int_min_bytes = E * NB * 16 * (runs * 8 * 1 + runs * 2) if p13.has_int_mins else 0   # int8 imins, fp16 dmin
        float_min_bytes = E * NB * 16 * G * 4 if p13.has_mins and not p13.has_int_mins else 0
        assert p13.nbytes == code_bytes + scale_bytes + int_min_bytes + float_min_bytes
        assert scale_bytes < E * NB * 16 * G * 4   # float scales
    check_layer_and_file(rng, tmp_path, (r13, p13), (r2, p2), k, form)


def test_integer_forms_need_an_fp16_d(rng, tmp_path):
    # The integer forms store d per run as fp16. Scales that are d * 6-bit ints with a d of 14 significant bits
    # (exact products in fp32, but no fp16 d) stay float scales and mins, with the same values and outputs.
    E, k, H, I = 3, 2, 320, 64
    G, runs = H // 32, -(-H // 32 // 8)
    mant, ex = np.frexp(rng.uniform(0.5, 1.5, (E, 2 * I, runs, 1)) / (4 * 63 * np.sqrt(H)))
    d = np.ldexp((np.floor(mant * 2 ** 14) + (np.floor(mant * 2 ** 14) % 2 == 0)) / 2 ** 14, ex).astype(np.float32)  # 14th bit set
    assert not np.array_equal(d, d.astype(np.float16).astype(np.float32))
    sc = rng.integers(1, 64, (E, 2 * I, runs, 8)).astype(np.float32)
    s = np.ascontiguousarray((d * sc).reshape(E, 2 * I, -1)[:, :, :G], np.float32)
    m = np.ascontiguousarray((d * sc[..., ::-1]).reshape(E, 2 * I, -1)[:, :, :G], np.float32)
    np.testing.assert_array_equal(s / np.repeat(d[..., 0], 8, axis=2)[:, :, :G], sc.reshape(E, 2 * I, -1)[:, :, :G])
    q = rng.integers(0, 16, (E, 2 * I, H)).astype(np.uint8)
    r13 = ref.RefWeights.int4(q, s, 32, codebook=UNSIGNED, mins=m)
    p13 = moe_cpu.pack_int4(q, s, 32, codebook=UNSIGNED, mins=m)
    assert not p13.has_int_scales and not p13.has_int_mins
    bits = lambda a: np.ascontiguousarray(a, np.float32).view(np.uint32)
    np.testing.assert_array_equal(bits(p13.unpack_quantized()["scales"]), bits(s))
    r2, p2 = form_weights(rng, "q4k_ks", E, H, I)
    assert p2.has_int_scales == int_scale_kernel(p2)   # the same shape with fp16 d: integer
    check_layer_and_file(rng, tmp_path, (r13, p13), (r2, p2), k, "q4k")


def half_form_kernel(p):
    """Whether p's kernel takes fp16 scales: the x86 int kernels but AMX's (AVX2, AVX-VNNI, AVX-512 VNNI), and the
    reference."""
    return kernel_isa(p.kernel) in ("avx2", "avx2vnni", "avx512vnni", "reference")


def fp16_scaled(rng, form, E, N, K, a16=False):
    """(RefWeights, PackedExperts) with groups of 32 and fp16 scales, as GGUF's Q4_0 / Q8_0 hold them (signed and
    zero scales, +-0, an fp16 subnormal); "_f32": one scale that is no fp16 value."""
    G = K // 32
    s = (rng.uniform(0.5, 1.5, (E, N, G)) / (8 * np.sqrt(K))).astype(np.float16)
    s[0, :4, 0] = np.array([-0.0, 0.0, -s[0, 4, 0], np.float16(2.0 ** -20)], np.float16)
    s = s.astype(np.float32)
    if form.endswith("_f32"):
        s[1, 2, 1] = np.nextafter(s[1, 2, 1], np.float32(1))
    if form.startswith("q4_0"):
        q, sch = rng.integers(-8, 8, (E, N, K)).astype(np.int8), "int4_w4a16" if a16 else "int4_w4a8"
        return ref.RefWeights.int4(q, s, 32, scheme=sch), moe_cpu.pack_int4(q, s, 32, scheme=sch)
    q, sch = rng.integers(-127, 128, (E, N, K)).astype(np.int8), "int8_w8a16" if a16 else "int8_w8a8"
    return ref.RefWeights.int8(q, s, 32, scheme=sch), moe_cpu.pack_int8(q, s, 32, scheme=sch)


@pytest.mark.parametrize("a16", [False, True])
@pytest.mark.parametrize("form", ["q4_0", "q8_0", "q4_0_f32", "q8_0_f32"])
def test_fp16_scales_run_as_fp16_on_x86(rng, tmp_path, form, a16):
    # Scales that are all fp16 values are held as fp16 on the kernels that read them (2 bytes per group and column
    # instead of 4: Q4_0 at 4.5 bits a weight, as ggml); one scale that is no fp16 value keeps them fp32. Exact
    # either way, against the reference and through a file (which holds fp32 scales).
    E, k, H, I = 3, 2, 320, 64
    r13, p13 = fp16_scaled(rng, form, E, 2 * I, H, a16)
    r2, p2 = fp16_scaled(rng, form, E, H, I, a16)
    half = half_form_kernel(p13) and not form.endswith("_f32")
    assert (p13.has_half_scales, p2.has_half_scales) == (half, half)
    bits = lambda a: np.ascontiguousarray(a, np.float32).view(np.uint32)
    np.testing.assert_array_equal(bits(p13.unpack_quantized()["scales"]), bits(r13.scales))   # signed zeros too
    codes = E * 2 * I * H // (2 if form.startswith("q4_0") else 1)
    assert p13.nbytes == codes + E * 2 * I * (H // 32) * (2 if half else 4)
    check_layer_and_file(rng, tmp_path, (r13, p13), (r2, p2), k, form)
    back = moe_cpu.load_packed(tmp_path / "w.moe")
    assert back.has_half_scales == half


def split_code_kernel(p):
    """Whether p's kernel takes split 2- to 6-bit int8 codes: the AVX2 vpmaddubsw one (w8a8_avx2), the
    AVX-512 VNNI one (w8a8_avx512vnni; not the AMX tiles) and the reference."""
    return p.kernel.startswith(SPLIT_CODE_KERNELS)


@pytest.mark.parametrize("form,bits", [("q5k", 5), ("q6k", 6), ("q5k_ks", 5), ("q6k_ks", 6), ("q6k_g32", 6),
                                       ("q6k_top", 6), ("q5k_g16", 6), ("q8_0", 8), ("q2k", 2), ("q2k_ks", 2),
                                       ("q2k_top", 2), ("q3k", 3), ("q3k_ks", 3), ("q3k_g32", 3), ("q3k_top", 3)])
def test_narrow_int8_codes_run_split(rng, tmp_path, form, bits):
    # int8 codes that span at most 4 / 8 / 16 / 32 / 64 values (Q2_K's 0..3 and Q3_K's -4..3 in groups of 16, Q5_K's
    # 0..31 in groups of 32, Q6_K's -32..31 in groups of 16) are held as 2 / 3 / 4 / 5 / 6-bit split codes by the
    # AVX2 and AVX-512 VNNI kernels instead of 8 bits (3-bit ones on AVX-512 only: AVX2 takes 4). 5-bit codes in groups of 16 take 6 bits; "top" puts every code at its range's top (the
    # largest int16 sums); q8_0 codes stay int8. Exact either way: against the reference, and through a file (which
    # holds the int8 codes).
    E, k, H, I = 3, 2, 320, 64
    base = form[:3] if form.endswith(("_g32", "_top", "_g16")) else form
    if form == "q8_0":
        r13, p13 = fp16_scaled(rng, "q8_0", E, 2 * I, H)
    else:
        r13, p13 = form_weights(rng, base, E, 2 * I, H, group=32 if form.endswith("_g32") else 16 if form == "q5k_g16" else None,
                                top=form.endswith("_top"))
    r2, p2 = form_weights(rng, "q6k", E, H, I)
    split = split_code_kernel(p13) and bits < 8
    if bits == 3 and not p13.kernel.startswith(("w8a8_avx512vnni_", "w8a8_reference")):   # 3 bits: not on AVX2
        bits = 4
    assert p13.code_bits == (bits if split else 8)
    if split:   # split codes take integer mins (q5k_ks, q2k: dmin * 6-bit m; AVX2 widens them to the float mins per group)
        assert p13.has_int_mins == (form == "q5k_ks" or form.startswith("q2k"))
    assert p2.code_bits == (6 if split_code_kernel(p2) else 8)
    np.testing.assert_array_equal(p13.unpack_quantized()["qweight"], r13.codes)
    x = make_input(rng, 37, H)
    tw, ids = make_routing(rng, 37, E, k)
    out = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    out1 = np.concatenate([moe_cpu.fused_experts(x[i:i + 1], p13, p2, tw[i:i + 1], ids[i:i + 1]) for i in range(4)])
    np.testing.assert_array_equal(out1, out[:4])   # decode (one row) and row tiles give the same bits
    check_layer_and_file(rng, tmp_path, (r13, p13), (r2, p2), k, form)


def q2k_file_weights(rng, E, N, K, sc_top=15):
    """Q2_K as the file holds it: codes 0..3 in groups of 16, scales d * sc and mins dmin * m with one fp16 d and
    dmin per 256 (a span of 16 groups) and 4-bit sc, m (sc up to sc_top); one span's scales all zero, one d zero."""
    G = K // 16
    spans = -(-G // 16)
    d = (rng.uniform(0.5, 1.5, (E, N, spans, 1)) / (4 * 15 * np.sqrt(K))).astype(np.float16).astype(np.float32)
    dm = (rng.uniform(0.2, 1.0, (E, N, spans, 1)) / (4 * 15 * np.sqrt(K))).astype(np.float16).astype(np.float32)
    d.reshape(-1)[3] = 0
    sc = rng.integers(0, sc_top + 1, (E, N, spans, 16)).astype(np.float32)
    sc.reshape(-1, 16)[5] = 0
    s = np.ascontiguousarray((d * sc).reshape(E, N, -1)[:, :, :G], np.float32)
    m = np.ascontiguousarray((dm * rng.integers(0, 16, (E, N, spans, 16))).reshape(E, N, -1)[:, :, :G], np.float32)
    q = rng.integers(0, 4, (E, N, K)).astype(np.int8)
    return ref.RefWeights.int8(q, s, 16, mins=m), moe_cpu.pack_int8(q, s, 16, mins=m)


@pytest.mark.parametrize("H", [320, 512])
def test_q2k_scales_and_mins_in_four_bits(rng, tmp_path, H):
    """Q2_K's scales and mins (4-bit sc, m with a d and dmin per 256) stay in 4 bits on the AVX2 and AVX-512 tiers:
    the packed experts take the file's 84 bytes per 256 weights (H = 512; 320: 20 groups, a span of 16 and a short
    one), unpack to the same floats, and run against the reference, a row alone as among others, and through a file."""
    E, k, I = 3, 2, 64
    r13, p13 = q2k_file_weights(rng, E, 2 * I, H)
    nib = split_code_kernel(p13)
    assert p13.has_int_nibbles == nib and p13.code_bits == (2 if split_code_kernel(p13) else 8)
    if nib:
        NB, runs = 2 * I // 16, -(-H // 16 // 8)
        pairs, spans = runs * 4, -(-runs // 2)
        assert p13.nbytes == E * NB * 16 * (H // 4 + 2 * pairs + 2 * 2 * spans)
        if H % 256 == 0:
            assert p13.nbytes == E * 2 * I * (H // 256) * 84   # the GGUF blocks' bytes
    bits = lambda a: np.ascontiguousarray(a, np.float32).view(np.uint32)
    d = p13.unpack_quantized()
    np.testing.assert_array_equal(bits(d["scales"]), bits(r13.scales))
    np.testing.assert_array_equal(bits(d["mins"]), bits(r13.mins))
    np.testing.assert_array_equal(p13.unpack(), r13.codes.astype(np.float32) * np.repeat(r13.scales, 16, axis=2) -
                                  np.repeat(r13.mins, 16, axis=2))
    r2, p2 = form_weights(rng, "q6k", E, H, I)
    x = make_input(rng, 37, H)
    tw, ids = make_routing(rng, 37, E, k)
    out = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    out1 = np.concatenate([moe_cpu.fused_experts(x[i:i + 1], p13, p2, tw[i:i + 1], ids[i:i + 1]) for i in range(4)])
    np.testing.assert_array_equal(out1, out[:4])
    check_layer_and_file(rng, tmp_path, (r13, p13), (r2, p2), k, "q2k")


@pytest.mark.parametrize("act_block", [32, 64, 128, 256])
def test_q2k_four_bit_forms_take_every_activation_block(rng, act_block):
    """The 4-bit forms against activation blocks of 2, 4, 8 and 16 groups: the reference's values, and a row's bits
    alone (decode) as in the row tiles."""
    E, k, H, I, M = 2, 2, 512, 64, 19
    r13, _ = q2k_file_weights(rng, E, 2 * I, H)
    p13 = moe_cpu.pack_int8(r13.codes, r13.scales, 16, mins=r13.mins, act_block=act_block)
    r13 = ref.RefWeights.int8(r13.codes, r13.scales, 16, mins=r13.mins, act_block=act_block)
    assert p13.has_int_nibbles == split_code_kernel(p13) and p13.act_block == act_block
    r2, p2 = form_weights(rng, "q6k", E, H, I)
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    many = moe_cpu.fused_experts(x, p13, p2, tw, ids)
    assert_close(many, ref.fused_experts_ref(x, r13, r2, tw, ids), "int8_w8a8", f"q2k B={act_block}")
    for m in (0, M - 1):
        np.testing.assert_array_equal(moe_cpu.fused_experts(x[m:m + 1], p13, p2, tw[m:m + 1], ids[m:m + 1])[0], many[m])


def test_q2k_scales_beyond_four_bits_stay_int8(rng, tmp_path):
    """Scales of 5 bits (sc up to 31) do not fit the 4-bit form: int8 integer scales, the same values and outputs."""
    E, k, H, I = 3, 2, 512, 64
    r13, p13 = q2k_file_weights(rng, E, 2 * I, H, sc_top=31)
    assert not p13.has_int_nibbles
    assert p13.has_int_scales == int_scale_kernel(p13)
    r2, p2 = form_weights(rng, "q6k", E, H, I)
    check_layer_and_file(rng, tmp_path, (r13, p13), (r2, p2), k, "q2k")


def test_every_fp16_scale_unpacks_as_numpy_widens_it():
    # Every finite fp16 value as a scale (NumPy's float16 -> float32 is the oracle): held as fp16 where the
    # kernel takes them, and unpacked to the same float32 bits.
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isfinite(h)].reshape(1, 16, -1)
    q = np.ones((1, 16, 32 * h.shape[2]), np.int8)
    p = moe_cpu.pack_int8(q, h.astype(np.float32), 32)
    assert p.has_half_scales == half_form_kernel(p)
    got = p.unpack_quantized()["scales"]
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.float32).view(np.uint32))


def test_int_float_pair_is_refused_by_name(rng):
    _, p13 = form_weights(rng, "q4k", 2, 64, 64)
    w2 = moe_cpu.quantize_experts(rng.standard_normal((2, 64, 32)).astype(np.float32), "bf16")
    x = make_input(rng, 2, 64)
    tw, ids = make_routing(rng, 2, 2, 1)
    with pytest.raises(ValueError, match="w13 is packed as int4_w4a8 but w2 as bf16"):
        moe_cpu.fused_experts(x, p13, w2, tw, ids)


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("form", FORMS)
def test_packed_file_round_trip(rng, tmp_path, form, mmap):
    _, p = form_weights(rng, form, 2, 48, 64)
    p.save(tmp_path / "w.moe")
    back = moe_cpu.load_packed(tmp_path / "w.moe", mmap=mmap)
    assert (back.form, back.nbytes, back.group_size) == (p.form, p.nbytes, p.group_size)
    np.testing.assert_array_equal(back.unpack(), p.unpack())
    for key, arr in p.unpack_quantized().items():
        got = back.unpack_quantized()[key]
        assert (arr is None and got is None) or np.array_equal(arr, got), key


@pytest.mark.parametrize("version", [1, 2])
def test_older_versions_still_load(rng, tmp_path, version):
    """A version 3 file of a form the older versions had, rewritten as they wrote it, loads to the same
    weights. Version 2: 4 sections, kernel name bytes (zero here) where version 3 has the k_perm
    section, 0 for has_k_perm. Version 1: 3 sections and zero padding from 208 on as well."""
    q = rng.integers(-8, 8, (2, 32, 64)).astype(np.int8)
    s = rng.uniform(0.5, 1, (2, 32, 2)).astype(np.float32)
    p = moe_cpu.pack_int4(q, s, 32)
    p.save(tmp_path / "v3.moe")
    b = bytearray((tmp_path / "v3.moe").read_bytes())
    assert struct.unpack_from("<I", b, 8)[0] == 3
    struct.pack_into("<I", b, 8, version)
    struct.pack_into("<I", b, 68, 2 + version)      # section count
    b[184:208] = bytes(24)                          # the rest of version 1 / 2's 64-byte kernel name
    if version == 1:
        b[208:252] = bytes(44)                      # version 1's zero padding
    struct.pack_into("<I", b, 252, zlib.crc32(bytes(b[:252])))
    (tmp_path / "old.moe").write_bytes(bytes(b))
    old = moe_cpu.load_packed(tmp_path / "old.moe")
    assert old.form == "int4"
    np.testing.assert_array_equal(old.unpack(), p.unpack())


@pytest.mark.parametrize("call,exc,needle", [
    ("moe_cpu.pack_int4(q, s, 32, zeros=np.zeros((1, 4, 2), np.uint8), codebook=IQ4_NL)", ValueError, "not both"),
    ("moe_cpu.pack_int4(q, s, 32, codebook=np.array(IQ4_NL, np.int16))", TypeError, "codebook"),
    ("moe_cpu.pack_int4(q, s, 32, codebook=IQ4_NL[:15])", ValueError, "codebook"),
    ("moe_cpu.pack_int4(q, s, 32, codebook=(200,) * 16)", ValueError, "int8 range"),
    ("moe_cpu.pack_int4(q + 16, s, 32, codebook=IQ4_NL)", ValueError, "[0, 15] (4-bit codebook indices)"),
    ("moe_cpu.pack_int4(q, s, 32, codebook=IQ4_NL, mins=np.full((1, 4, 2), np.nan, np.float32))", ValueError, "mins"),
    ("moe_cpu.pack_int4(q, s, 32, codebook=IQ4_NL, mins=np.zeros((1, 4, 3), np.float32))", ValueError, "mins"),
    ("moe_cpu.pack_int8(q.view(np.int8), s, 32, mins=np.zeros((1, 4, 2), np.float64))", TypeError, "mins"),
])
def test_bad_forms_raise(call, exc, needle):
    q = np.zeros((1, 4, 64), np.uint8)
    s = np.ones((1, 4, 2), np.float32)
    with pytest.raises(exc, match=None) as info:
        eval(call, {"moe_cpu": moe_cpu, "np": np, "q": q, "s": s, "IQ4_NL": IQ4_NL})
    assert needle in str(info.value)
