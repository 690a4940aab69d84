"""Hidden states with outliers: the kernel error of each scheme, on every ISA level (`isa`).

Real LLM hidden states have a few channels 20-100x larger than the rest ("outlier features", "massive
activations"), single huge tokens and spikes. The kernel error here is what the scheme's arithmetic adds on
its own weights: relative L2 of fused_experts against float64 run on the weights unpack() returns (the
dequantized weights), so weight quantization is left out.
- fp8_w8a16 / bf16 keep 16-bit activations: <= 5e-3 on every case. So do int4_w4a16 / int8_w8a16 (the A8
  schemes' weights with int16 activation codes per token): <= 5e-3, measured <= 3e-4 (docs/numerics.md).
- int4_w4a8 / int8_w8a8 quantize activations to int8 with one scale per token, so an outlier channel spends the
  int8 range: the figures of docs/numerics.md ("Activation outliers"), asserted within 25%, and the outlier
  cases cost at least 2.5x the Gaussian case.
- The same A8 schemes with activation blocks of 32 (one int8 scale per 32 channels, ggml's Q8_0): an outlier
  spends only its own block's range; the figures beside per-token A8 in docs/numerics.md, asserted within 25%,
  and never above the per-token error of the same case.
"""
import numpy as np
import pytest

import moe_cpu
from moe_cpu.reference import fused_experts_float64

pytestmark = pytest.mark.isa

E, H, I, TOPK, M = 16, 512, 256, 4, 48
CASES = ("gaussian", "channels_x20", "channels_x100", "one_large_token", "token_spikes", "channel_spikes")
SCHEMES = ("int4_w4a8", "int8_w8a8", "fp8_w8a16", "bf16", "int4_w4a16", "int8_w8a16", "int4_w4a8/b32", "int8_w8a8/b32")
# Kernel error (relative L2) of the A8 schemes at this shape, the larger of int4 / int8 (the same to 3 digits at
# the levels native (AVX-512), avx2, amx_model and reference; docs/numerics.md); the tests allow 25% above.
A8_ERROR = {
    "gaussian": 1.9e-2, "channels_x20": 5.7e-2, "channels_x100": 5.9e-2,
    "one_large_token": 1.4e-2, "token_spikes": 7.6e-2, "channel_spikes": 6.5e-2,
}
# The same with activation blocks of 32 (the larger of int4 / int8; docs/numerics.md).
A8_B32_ERROR = {
    "gaussian": 1.18e-2, "channels_x20": 1.87e-2, "channels_x100": 1.78e-2,
    "one_large_token": 1.01e-2, "token_spikes": 1.96e-2, "channel_spikes": 1.98e-2,
}


def hidden_states(case, rng):
    x = rng.standard_normal((M, H)).astype(np.float32)
    chans = rng.choice(H, size=4, replace=False)
    if case == "channels_x20":          # 4 of 512 channels 20x larger in every token
        x[:, chans] *= 20
    elif case == "channels_x100":
        x[:, chans] *= 100
    elif case == "one_large_token":     # one token 1000x the others
        x[7] *= 1000
    elif case == "token_spikes":        # each token: one channel of its own at 100x
        x[np.arange(M), rng.integers(0, H, M)] *= 100
    elif case == "channel_spikes":      # two channels at 100x in every other token
        x[::2, chans[:2]] *= 100
    return x


@pytest.fixture(scope="module")
def layer():
    rng = np.random.default_rng(33)
    w13 = (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32)
    w2 = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
    logits = rng.standard_normal((M, E)).astype(np.float32)
    topk_w, topk_ids = moe_cpu.select_experts(logits, TOPK, renormalize=True)
    packed = {}  # scheme -> (w13, w2) packed at the level this test runs, each packed once
    return w13, w2, topk_w, topk_ids, packed


def kernel_error(layer, scheme, case):
    w13, w2, topk_w, topk_ids, packed = layer
    if scheme not in packed:
        name, _, b = scheme.partition("/b")   # "int4_w4a8/b32": activation blocks of 32
        block = int(b) if b else None
        packed[scheme] = (moe_cpu.quantize_experts(w13, name, act_block=block),
                          moe_cpu.quantize_experts(w2, name, act_block=block))
    p13, p2 = packed[scheme]
    x = hidden_states(case, np.random.default_rng(CASES.index(case)))
    got = moe_cpu.fused_experts(x, p13, p2, topk_w, topk_ids).astype(np.float64)
    want = fused_experts_float64(x, p13.unpack(), p2.unpack(), topk_w, topk_ids)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_kernel_error_under_outliers(layer, scheme, case):
    err = kernel_error(layer, scheme, case)
    if "/b32" in scheme:
        assert err <= 1.25 * A8_B32_ERROR[case], (scheme, case, err)
        assert err <= kernel_error(layer, scheme.split("/")[0], case), (scheme, case, err)
    elif scheme not in moe_cpu.A8_SCHEMES:
        assert err <= 5e-3, (scheme, case, err)
        if scheme in moe_cpu.A16_SCHEMES:   # int16 codes: 10x below bf16 rounding (measured <= 2.9e-4)
            assert err <= 1e-3, (scheme, case, err)
    else:
        assert err <= 1.25 * A8_ERROR[case], (scheme, case, err)


@pytest.mark.parametrize("scheme", ["int4_w4a8", "int8_w8a8"])
def test_outlier_channels_cost_the_int8_activations(layer, scheme):
    base = kernel_error(layer, scheme, "gaussian")
    for case in ("channels_x20", "channels_x100", "token_spikes", "channel_spikes"):
        assert kernel_error(layer, scheme, case) >= 2.5 * base, case


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("scheme", ["int4_w4a16", "int8_w8a16"])
def test_non_finite_hidden_states_as_bf16(layer, scheme, bad):
    """A NaN or inf hidden state: the same ValueError as the bf16 path, naming the element."""
    w13, w2, topk_w, topk_ids, packed = layer
    x = hidden_states("gaussian", np.random.default_rng(0))
    x[3, 17] = bad
    errors = []
    for s in (scheme, "bf16"):
        if s not in packed:
            packed[s] = moe_cpu.quantize_experts(w13, s), moe_cpu.quantize_experts(w2, s)
        with pytest.raises(ValueError) as e:
            moe_cpu.fused_experts(x, *packed[s], topk_w, topk_ids)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "hidden_states[3, 17] is not finite" in errors[0], errors
