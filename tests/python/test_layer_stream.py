"""MoELayer.submit(x, stream) (issue 34) and the router GEMM behind both it and the blocking layer.

The layer runs as one C++ call (router, select_experts, experts, shared expert); on a Stream it is the same call,
so the results are compared bit for bit with ``layer(x)``, and ``layer(x)`` against the float64 reference. The
router's logits are checked against float64 NumPy and for batch invariance."""
import gc

import numpy as np
import pytest

import moe_cpu
from conftest import make_input

E, H, I, K = 16, 136, 64, 4   # H not a multiple of 16: the router's lane tail


def float_layer(seed, **kw):
    rng = np.random.default_rng(seed)
    gate = rng.standard_normal((E, H), dtype=np.float32) * 0.2
    w13 = rng.standard_normal((E, 2 * I, H), dtype=np.float32) * 0.05
    w2 = rng.standard_normal((E, H, I), dtype=np.float32) * 0.05
    if kw.pop("shared", False):
        kw["shared_w13"] = rng.standard_normal((2 * 48, H), dtype=np.float32) * 0.05
        kw["shared_w2"] = rng.standard_normal((H, 48), dtype=np.float32) * 0.05
    if kw.pop("gated", False):
        kw["shared_expert_gate"] = rng.standard_normal(H, dtype=np.float32) * 0.1
    if kw.pop("biases", False):
        kw["w13_bias"] = rng.standard_normal((E, 2 * I), dtype=np.float32) * 0.1
        kw["w2_bias"] = rng.standard_normal((E, H), dtype=np.float32) * 0.1
        kw["gate_bias"] = rng.standard_normal(E, dtype=np.float32) * 0.1
    kw.setdefault("scheme", "int8_w8a16")
    kw.setdefault("group_size", -1 if kw["scheme"].startswith("int4") else None)   # H: no group of 32 divides it
    return moe_cpu.MoELayer.from_float(gate, w13, w2, top_k=K, **kw)


CONFIGS = {
    "int8_w8a16": dict(),
    "int4_w4a8_shared": dict(scheme="int4_w4a8", shared=True, renormalize=True),
    "bf16_gated_shared": dict(scheme="bf16", shared=True, gated=True),
    "fp8_grouped_sigmoid": dict(scheme="fp8_w8a16", block_size=(8, 8), scoring_func="sigmoid",
                                use_grouped_topk=True, num_expert_group=4, topk_group=2,
                                routed_scaling_factor=2.5, e_score_correction_bias=np.linspace(-0.1, 0.1, E, dtype=np.float32)),
    "int4_w4a16_biases_swigluoai": dict(scheme="int4_w4a16", biases=True, activation="swigluoai"),
}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_submit_equals_the_blocking_layer_and_the_reference(name, dtype):
    layer = float_layer(1, **CONFIGS[name])
    rng = np.random.default_rng(2)
    xs = [make_input(rng, M, H, dtype) for M in (1, 7, 40, 0)]
    with moe_cpu.Stream() as s:
        hs = [layer.submit(x, s) for x in xs]
        for x, h in zip(xs, hs):
            got, want = h.wait(), layer(x)
            assert got.dtype == x.dtype and got.shape == x.shape
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
            if x.shape[0]:
                tol = 2e-2 if name.startswith("int4_w4a8") or dtype == "bfloat16" else 5e-3
                assert rel(want.astype(np.float32), layer.reference(x)) < tol


def test_layer_tasks_run_in_order_with_fused_experts_on_one_stream():
    layer = float_layer(3, scheme="int4_w4a16", shared=True)
    rng = np.random.default_rng(4)
    x = make_input(rng, 9, H)
    w, ids = layer.route(x)
    want_fused = moe_cpu.fused_experts(x, layer.w13, layer.w2, w, ids)
    with moe_cpu.Stream(num_threads=1) as s:
        a = layer.submit(x, s)
        b = s.submit(x, layer.w13, layer.w2, w, ids)
        c = layer.submit(x, s)
        np.testing.assert_array_equal(c.wait(), layer(x))
        assert a.done() and b.done()
        np.testing.assert_array_equal(a.wait(), c.wait())
        np.testing.assert_array_equal(b.wait(), want_fused)
    # the layer = routed experts on its own routing + the shared expert (an independent composition)
    np.testing.assert_array_equal(layer(x), layer.run_experts(x, w, ids))


def test_errors_at_submit_and_at_wait():
    layer = float_layer(5, biases=True)
    rng = np.random.default_rng(6)
    x = make_input(rng, 6, H)
    with moe_cpu.Stream() as s:
        with pytest.raises(ValueError, match=r"x has shape \[6, 8\]"):
            layer.submit(x[:, :8].copy(), s)
        with pytest.raises(TypeError, match="float32 or bfloat16"):
            layer.submit(x.astype(np.float64), s)
        with pytest.raises(ValueError, match="C-contiguous"):
            layer.submit(np.asfortranarray(x), s)
        xn = x.copy()
        xn[4, 5] = np.inf
        with pytest.raises(ValueError, match=r"hidden_states\[4, 5\] is not finite"):
            layer.submit(xn, s)
        with pytest.raises(ValueError, match=r"hidden_states\[4, 5\] is not finite"):
            layer(xn)
        with pytest.raises(TypeError, match="stream must be a moe_cpu.Stream"):
            layer.submit(x, None)
        s.sync()
        # a run-time error: a routed expert's bias turned non-finite after construction
        _, ids = layer.route(x)
        layer.w2_bias[ids[0, 0], 3] = np.nan
        with pytest.raises(ValueError) as blocking:
            layer(x)
        h = layer.submit(x, s)
        later = s.submit(x, layer.w13, layer.w2, *layer.route(x))
        for _ in range(2):
            with pytest.raises(ValueError) as waited:
                h.wait()
            assert str(waited.value) == str(blocking.value) and "w2_bias" in str(waited.value)
        assert later.wait().shape == x.shape
    with pytest.raises(ValueError, match="closed"):
        layer.submit(x, s)


def test_the_task_holds_x_and_the_layer():
    rng = np.random.default_rng(7)
    x = make_input(rng, 5, H)
    want = float_layer(8, shared=True)(x)
    with moe_cpu.Stream(spin_us=0) as s:
        layer = float_layer(8, shared=True)
        h = layer.submit(x.copy(), s)
        del layer
        gc.collect()
        np.testing.assert_array_equal(h.wait(), want)


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    layer = float_layer(9)
    x = torch.randn(3, H)
    with moe_cpu.Stream() as s:
        got = layer.submit(x, s).wait()
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(got.numpy(), layer(x.numpy()))
    xb = x.to(torch.bfloat16)
    with moe_cpu.Stream() as s:
        gb = layer.submit(xb, s).wait()
    assert gb.dtype == torch.bfloat16
    np.testing.assert_array_equal(gb.view(torch.int16).numpy(), layer(xb).view(torch.int16).numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_router_logits_against_float64_and_batch_invariant(dtype):
    layer = float_layer(10, biases=True)
    rng = np.random.default_rng(11)
    x = make_input(rng, 37, H, dtype, scale=3.0)
    logits = layer.router_logits(x)
    assert logits.dtype == np.float32 and logits.shape == (37, E)
    xf = np.asarray(x, np.float32).astype(np.float64)
    want = xf @ layer.gate.astype(np.float64).T + layer.gate_bias
    scale = np.abs(xf) @ np.abs(layer.gate.astype(np.float64)).T
    assert np.max(np.abs(logits - want) / scale) < 1e-6
    for m in (0, 5, 36):   # a row alone, and in blocks of other sizes, gives the same bits
        np.testing.assert_array_equal(layer.router_logits(x[m:m + 1].copy())[0], logits[m])
    np.testing.assert_array_equal(layer.router_logits(x[3:10].copy()), logits[3:10])
    n = moe_cpu.get_num_threads()
    moe_cpu.set_num_threads(1)
    try:
        np.testing.assert_array_equal(layer.router_logits(x), logits)
    finally:
        moe_cpu.set_num_threads(n)


def test_shared_gate_against_float64():
    layer = float_layer(12, shared=True, gated=True)
    x = make_input(np.random.default_rng(13), 9, H)
    z = x.astype(np.float64) @ layer.shared_expert_gate.astype(np.float64)
    np.testing.assert_allclose(layer.shared_gate(x), 1 / (1 + np.exp(-z)), rtol=1e-6, atol=1e-7)


def test_router_logits_are_the_same_bits_on_every_isa_level():
    rng = np.random.default_rng(14)
    levels = ["reference"] + [lv for lv in ("avx2", "avx512") if lv in moe_cpu.cpu_features()["detected"]]
    for h in (2048, 136, 7):
        gate = rng.standard_normal((37, h), dtype=np.float32)
        x = rng.standard_normal((13, h), dtype=np.float32)
        got = {}
        try:
            for lv in ["native"] + levels:
                moe_cpu.force_isa(lv)
                got[lv] = moe_cpu._core.router_logits(x, gate, None).view(np.uint32)
        finally:
            moe_cpu.force_isa("native")
        for lv in levels:
            np.testing.assert_array_equal(got[lv], got["native"], err_msg=f"H={h}, level {lv}")
        want = x.astype(np.float64) @ gate.T.astype(np.float64)
        assert np.max(np.abs(got["native"].view(np.float32) - want)) < 1e-5 * np.max(np.abs(x) @ np.abs(gate).T)
