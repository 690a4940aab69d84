"""Shared helpers for the Python tests: seeded RNG, weight builders, routing builders, tolerances.

Test files import the reference as `from conftest import ref`. moe_cpu (the compiled package) is imported
lazily inside the helpers that need it, so the reference self-tests also run before the C++ build.
MOE_CPU_ISA may force a kernel path; nothing here depends on it.
"""
import importlib.util
import pathlib
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

try:
    from moe_cpu import reference as ref
except ImportError:   # extension not built yet: load the pure-NumPy reference straight from its file
    _path = pathlib.Path(__file__).resolve().parents[2] / "moe_cpu" / "reference.py"
    _spec = importlib.util.spec_from_file_location("moe_cpu_reference", _path)
    ref = importlib.util.module_from_spec(_spec)
    sys.modules["moe_cpu_reference"] = ref
    _spec.loader.exec_module(ref)

# Tolerances: max |actual - ref| <= TOL * max|ref| + ATOL.
# Int schemes need slack: the C++ GEMM1 output (fp32 accumulation) can differ from the reference in its
# last bits, and a value close to a rounding boundary then re-quantizes to a neighbouring int8 code.
TOL_INT4_W4A8 = 2e-2
TOL_INT8_W8A8 = 1e-2
TOL_FP8_W8A16 = 5e-3     # a bf16 rounding flip of one intermediate value
TOL_BF16 = 5e-3
TOL_A16 = 1e-3           # int16 activation codes: a flipped code moves 1 / 32767 of the row's range
TOL = {"int4_w4a8": TOL_INT4_W4A8, "int8_w8a8": TOL_INT8_W8A8, "fp8_w8a16": TOL_FP8_W8A16, "bf16": TOL_BF16,
       "int4_w4a16": TOL_A16, "int8_w8a16": TOL_A16}
ATOL = 1e-6
TOL_BF16_OUTPUT = 2.0 ** -8   # extra relative slack when the output dtype is bf16 (one final rounding)
# Typical-error check (only with >= TIGHT_MIN_ROWS rows, where flips touch few rows): the median error
# against the reference rounded to the output dtype must be below TIGHT * max|ref|. This catches a
# missing activation quantization / bf16 rounding, which the loose max bound above would let through.
TIGHT = 2e-5
TIGHT_MIN_ROWS = 16
# The int8 kernels that hold narrow codes as split 2- to 6-bit codes (by name prefix; not the AMX tiles).
SPLIT_CODE_KERNELS = ("w8a8_avx2_", "w8a8_avx512vnni_", "w8a8_reference")


@pytest.fixture
def rng(request):
    """RNG seeded from the test name (stable across runs and machines)."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def as_float32(a):
    """Output of moe_cpu (float32, ml_dtypes.bfloat16 or uint16 bits) -> float32 values."""
    return ref.to_float32_values(a)


def assert_close(actual, expected, scheme, what=""):
    """Compare a moe_cpu result with a float64 reference result using the scheme's named tolerance."""
    actual = np.asarray(actual)
    got = as_float32(actual).astype(np.float64)
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if expected.size == 0:
        return
    bf16_out = actual.dtype == np.uint16 or actual.dtype.name == "bfloat16"
    scale = float(np.max(np.abs(expected)))
    tol = TOL[scheme] + (TOL_BF16_OUTPUT if bf16_out else 0.0)
    err = np.abs(got - expected)
    assert np.all(np.isfinite(got)), f"{what}: non-finite output"
    assert err.max() <= tol * scale + ATOL, (
        f"{what}: max error {err.max():.3e} > {tol:g} * max|ref| {scale:.3e} (+{ATOL:g}) for {scheme}, "
        f"at {np.unravel_index(err.argmax(), err.shape)}")
    if expected.shape[0] >= TIGHT_MIN_ROWS:
        rounded = expected.astype(np.float32)
        if bf16_out:
            rounded = ref.bf16_round(rounded)
        typical = float(np.median(np.abs(got - rounded)))
        assert typical <= TIGHT * scale + ATOL, (
            f"{what}: median error {typical:.3e} > {TIGHT:g} * max|ref| {scale:.3e} for {scheme}")


def float_weights(rng, E, N, K):
    """Gaussian float32 weights [E,N,K] with unit-variance outputs for unit-variance inputs."""
    return (rng.standard_normal((E, N, K)) / np.sqrt(K)).astype(np.float32)


def make_weights(rng, scheme, E, N, K, group_size=None, zeros=False, block=(128, 128), edge_codes=True,
                 bf16_scales=False, act_block=None):
    """Random quantized weights as (RefWeights, PackedExperts) holding the same codes.

    Codes come from the reference quantizers on Gaussian weights. With edge_codes, some -7 / -127
    codes become -8 / -128 (legal codes the quantizer never emits). zeros=True gives int4 with zero
    points; bf16_scales passes int4 scales as ml_dtypes.bfloat16; act_block sets A8 activation blocks.
    """
    import moe_cpu

    w = float_weights(rng, E, N, K)
    if scheme in ("int4_w4a8", "int4_w4a16"):
        g = 128 if group_size is None else group_size
        if zeros:
            q, s, z = ref.quantize_int4_zp(w, g)
        else:
            q, s = ref.quantize_int4(w, g)
            z = None
            if edge_codes:
                q[(q == -7) & (rng.random(q.shape) < 0.5)] = -8
        if bf16_scales:
            s = ref.bf16_round(s).astype(ml_dtypes.bfloat16)
        return (ref.RefWeights.int4(q, s, g, z, scheme=scheme, act_block=act_block),
                moe_cpu.pack_int4(q, s, group_size=g, zeros=z, scheme=scheme, act_block=act_block))
    if scheme in ("int8_w8a8", "int8_w8a16"):
        g = -1 if group_size is None else group_size
        q, s = ref.quantize_int8(w, g)
        if edge_codes:
            q[(q == -127) & (rng.random(q.shape) < 0.5)] = -128
        return (ref.RefWeights.int8(q, s, g, scheme=scheme, act_block=act_block),
                moe_cpu.pack_int8(q, s, group_size=g, scheme=scheme, act_block=act_block))
    if scheme == "fp8_w8a16":
        codes, s = ref.quantize_fp8(w, block)
        return ref.RefWeights.fp8(codes, s, block), moe_cpu.pack_fp8(codes, s, block_size=tuple(block))
    if scheme == "bf16":
        bits = ref.quantize_bf16(w)
        return ref.RefWeights.bf16(bits), moe_cpu.pack_bf16(bits)
    raise ValueError(scheme)


def make_moe(rng, cfg, E, H, I):
    """(w13_ref, w13_packed, w2_ref, w2_packed) for a scheme config dict (see SCHEME_CONFIGS)."""
    opts = {key: v for key, v in cfg.items() if key != "scheme"}
    w13r, w13p = make_weights(rng, cfg["scheme"], E, 2 * I, H, **opts)
    w2r, w2p = make_weights(rng, cfg["scheme"], E, H, I, **opts)
    return w13r, w13p, w2r, w2p


def make_routing(rng, M, E, k, dtype=np.int32):
    """Distinct random ids per row (k <= E) and router weights in (0.1, 1)."""
    ids = np.argsort(rng.random((M, E)), axis=1)[:, :k].astype(dtype)
    weights = rng.uniform(0.1, 1.0, (M, k)).astype(np.float32)
    return weights, np.ascontiguousarray(ids)


def make_input(rng, M, H, dtype="float32", scale=1.0):
    """Hidden states [M,H] ~ N(0, scale^2): float32, ml_dtypes.bfloat16 ("bfloat16") or raw bf16 bits ("uint16")."""
    x = (rng.standard_normal((M, H)) * scale).astype(np.float32)
    if dtype == "float32":
        return x
    bits = ref.float_to_bf16_bits(x)
    return bits if dtype == "uint16" else bits.view(ml_dtypes.bfloat16)


# Scheme configurations the numerics tests sweep (H and I must be multiples of int4 group sizes).
SCHEME_CONFIGS = {
    "int4_g32": dict(scheme="int4_w4a8", group_size=32),
    "int4_g64_zp": dict(scheme="int4_w4a8", group_size=64, zeros=True),
    "int4_g128": dict(scheme="int4_w4a8", group_size=128),
    "int4_pc": dict(scheme="int4_w4a8", group_size=-1),
    "int4_g32_bf16scales": dict(scheme="int4_w4a8", group_size=32, bf16_scales=True),
    "int8": dict(scheme="int8_w8a8"),
    "int8_g32": dict(scheme="int8_w8a8", group_size=32),
    "fp8_128": dict(scheme="fp8_w8a16"),
    "fp8_32x64": dict(scheme="fp8_w8a16", block=(32, 64)),
    "bf16": dict(scheme="bf16"),
    # A16: the int weights with int16 activations per token
    "w4a16_g32": dict(scheme="int4_w4a16", group_size=32),
    "w4a16_g64_zp": dict(scheme="int4_w4a16", group_size=64, zeros=True),
    "w4a16_pc": dict(scheme="int4_w4a16", group_size=-1),
    "w8a16": dict(scheme="int8_w8a16"),
    "w8a16_g32": dict(scheme="int8_w8a16", group_size=32),
}
