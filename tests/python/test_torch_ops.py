"""torch.ops.moe_cpu (moe_cpu.torch_ops): the custom ops against the NumPy reference, zero copy, the out
variant, torch.compile(fullgraph=True) on the CPU, fake (meta) shapes, bad input, and moe_cpu without torch."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import moe_cpu  # noqa: E402
import moe_cpu.torch_ops as mt  # noqa: E402
from moe_cpu._tensors import to_numpy  # noqa: E402
from conftest import assert_close, make_moe, ref  # noqa: E402

pytestmark = pytest.mark.slow   # subprocesses / torch / mpirun: native level only, not in `test.sh quick`

E, H, I, M, K = 8, 128, 64, 19, 2
ops = torch.ops.moe_cpu


def bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


@pytest.fixture(scope="module")
def moe():
    """(w13 ref, w2 ref, w13 handle, w2 handle) for int8 weights; handles released at the end."""
    rng = np.random.default_rng(5)
    w13r, w13p, w2r, w2p = make_moe(rng, {"scheme": "int8_w8a8"}, E, H, I)
    h13, h2 = mt.register(w13p), mt.register(w2p)
    yield w13r, w2r, h13, h2
    mt.release(h13)
    mt.release(h2)


def inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g).to(dtype)
    logits = torch.randn(M, E, generator=g)
    return x, logits


def test_ops_run_a16_weights():
    """An int4_w4a16 handle: the op computes what moe_cpu.fused_experts computes (16-bit activations)."""
    rng = np.random.default_rng(6)
    w13r, w13p, w2r, w2p = make_moe(rng, {"scheme": "int4_w4a16", "group_size": 32}, E, H, I)
    h13, h2 = mt.register(w13p), mt.register(w2p)
    try:
        x, logits = inputs(torch.float32, seed=3)
        w, ids = ops.select_experts(logits, K, renormalize=True)
        y = ops.fused_experts(x, h13, h2, w, ids)
        want = ref.fused_experts_ref(x.numpy(), w13r, w2r, w.numpy(), ids.numpy())
        assert_close(y.numpy(), want, "int4_w4a16", "op int4_w4a16")
        np.testing.assert_array_equal(y.numpy(), moe_cpu.fused_experts(x.numpy(), w13p, w2p, w.numpy(), ids.numpy()))
    finally:
        mt.release(h13)
        mt.release(h2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_match_reference(moe, dtype):
    w13r, w2r, h13, h2 = moe
    x, logits = inputs(dtype)
    w, ids = ops.select_experts(logits, K, renormalize=True)
    want_w, want_ids = ref.select_experts_ref(logits.numpy(), K, renormalize=True)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == ids.shape == (M, K)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-6)
    y = ops.fused_experts(x, h13, h2, w, ids)
    assert y.dtype == dtype and y.shape == (M, H)
    xn = x.numpy() if dtype == torch.float32 else bits(x)
    got = y.numpy() if dtype == torch.float32 else bits(y)
    assert_close(got, ref.fused_experts_ref(xn, w13r, w2r, w.numpy(), ids.numpy()), "int8_w8a8", f"op {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_copy_and_out_writes_through(moe, dtype):
    _, _, h13, h2 = moe
    x, logits = inputs(dtype, 1)
    assert to_numpy(x, "x", (dtype,)).ctypes.data == x.data_ptr()        # inputs are views
    w, ids = ops.select_experts(logits, K)
    y = ops.fused_experts(x, h13, h2, w, ids)
    out = torch.full_like(x, float("nan"))
    ptr = out.data_ptr()
    ops.fused_experts_out(x, h13, h2, w, ids, out)
    assert out.data_ptr() == ptr and torch.equal(out, y)
    x2 = x.clone()
    ops.fused_experts_out(x2, h13, h2, w, ids, x2)                       # in place: out is hidden_states
    assert torch.equal(x2, y)


def test_biases_expert_map_and_int64_ids(moe):
    """Optional tensors reach the kernel: biases, expert_map (global ids) and int64 ids."""
    w13r, w2r, h13, h2 = moe
    x, logits = inputs(torch.float32, 2)
    g = torch.Generator().manual_seed(3)
    b13, b2 = torch.randn(E, 2 * I, generator=g), torch.randn(E, H, generator=g)
    emap = torch.tensor([-1] * 4 + list(range(E)) + [-1] * 4, dtype=torch.int32)   # E_global = 16
    w, ids = ops.select_experts(torch.randn(M, 16, generator=g), K)
    y = ops.fused_experts(x, h13, h2, w, ids.long(), "silu", False, b13, b2, emap)
    want = ref.fused_experts_ref(x.numpy(), w13r, w2r, w.numpy(), ids.numpy(), w13_bias=b13.numpy(),
                                 w2_bias=b2.numpy(), expert_map=emap.numpy())
    assert_close(y.numpy(), want, "int8_w8a8", "biases + expert_map")


def test_select_experts_grouped_sigmoid():
    g = torch.Generator().manual_seed(4)
    logits, bias = torch.randn(M, 16, generator=g), torch.randn(16, generator=g) * 0.1
    kw = dict(renormalize=True, scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=4, topk_group=2,
              routed_scaling_factor=2.5)
    w, ids = ops.select_experts(logits, 3, e_score_correction_bias=bias, **kw)
    want_w, want_ids = ref.select_experts_ref(logits.numpy(), 3, e_score_correction_bias=bias.numpy(), **kw)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-6)


def test_fake_shapes(moe):
    """The fake kernels give shapes on the meta device, without running anything."""
    _, _, h13, h2 = moe
    x = torch.empty(7, H, dtype=torch.bfloat16, device="meta")
    w, ids = ops.select_experts(torch.empty(7, E, device="meta"), 3)
    assert (w.shape, w.dtype, ids.dtype, w.device.type) == ((7, 3), torch.float32, torch.int32, "meta")
    y = ops.fused_experts(x, h13, h2, w, ids)
    assert (y.shape, y.dtype, y.device.type) == ((7, H), torch.bfloat16, "meta")


class Block(torch.nn.Module):
    """Routing, experts and an out= write, with torch ops around them."""

    def __init__(self, h13, h2):
        super().__init__()
        self.h13, self.h2 = h13, h2
        self.gate = torch.nn.Linear(H, E, bias=False)

    def forward(self, x, out):
        w, ids = ops.select_experts(self.gate(x).float(), K, renormalize=True)
        y = ops.fused_experts(x, self.h13, self.h2, w, ids)
        ops.fused_experts_out(x, self.h13, self.h2, w, ids, out)
        return x + y, w


def test_torch_compile_fullgraph(moe):
    _, _, h13, h2 = moe
    torch.manual_seed(0)
    block = Block(h13, h2).to(torch.bfloat16).eval()
    x, _ = inputs(torch.bfloat16, 6)
    eager_out, compiled_out = torch.empty_like(x), torch.empty_like(x)
    with torch.no_grad():
        want = block(x, eager_out)
        torch._dynamo.reset()
        got = torch.compile(block, fullgraph=True)(x, compiled_out)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)       # the same experts and weights
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert torch.equal(compiled_out, eager_out) and not torch.isnan(compiled_out.float()).any()


def test_bad_inputs(moe):
    _, _, h13, h2 = moe
    x, logits = inputs(torch.float32, 7)
    w, ids = ops.select_experts(logits, K)
    cases = [
        (lambda: ops.fused_experts(x.t().contiguous().t(), h13, h2, w, ids), ValueError,
         "hidden_states must be contiguous"),
        (lambda: ops.fused_experts(x.half(), h13, h2, w, ids), TypeError, "hidden_states has dtype torch.float16"),
        (lambda: ops.fused_experts(x, h13, 10**9, w, ids), ValueError, "w2 = 1000000000 is not a registered handle"),
        (lambda: ops.fused_experts(x, h13, h2, w.double(), ids), TypeError, "topk_weights has dtype torch.float64"),
        (lambda: ops.fused_experts(x, h13, h2, w, ids.short()), TypeError, "topk_ids has dtype torch.int16"),
        (lambda: ops.fused_experts(x[:, :64].contiguous(), h13, h2, w, ids), ValueError, "H = 64"),
        (lambda: ops.fused_experts_out(x, h13, h2, w, ids, torch.empty(M, H, dtype=torch.bfloat16)), TypeError,
         "out has dtype torch.bfloat16 but hidden_states is torch.float32"),
        (lambda: ops.fused_experts_out(x, h13, h2, w, ids, torch.empty(M, 2 * H)[:, ::2]), ValueError,
         "out must be contiguous"),
        (lambda: ops.select_experts(logits.bfloat16(), K), TypeError, "router_logits has dtype torch.bfloat16"),
        (lambda: to_numpy(torch.empty(2, device="meta"), "x", (torch.float32,)), ValueError, "x is on meta"),
        (lambda: to_numpy(x.numpy(), "x", (torch.float32,)), TypeError, "x must be a torch.Tensor"),
        (lambda: mt.register(x), TypeError, "packed must be a moe_cpu.PackedExperts"),
        (lambda: mt.release(10**9), ValueError, "not registered"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


def test_release_invalidates_handle(moe):
    w13r, _, h13, h2 = moe
    h = mt.register(mt.lookup(h13))
    assert mt.lookup(h) is mt.lookup(h13)
    mt.release(h)
    x, logits = inputs(torch.float32, 8)
    w, ids = ops.select_experts(logits, K)
    with pytest.raises(ValueError, match=f"w13 = {h} is not a registered handle"):
        ops.fused_experts(x, h, h2, w, ids)


def test_moe_cpu_without_torch(tmp_path):
    """With torch blocked: moe_cpu and moe_cpu.integrations import, torch_ops raises ImportError naming torch."""
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers"):
                    raise ImportError(f"blocked: {name}")
        sys.meta_path.insert(0, Block())
        import moe_cpu, moe_cpu.integrations
        for mod in ("moe_cpu.torch_ops", "moe_cpu.integrations.transformers"):
            try:
                __import__(mod)
            except ImportError as e:
                assert "torch" in str(e), e
            else:
                raise AssertionError(mod + " imported without torch")
        assert "torch" not in sys.modules
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
