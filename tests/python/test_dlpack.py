"""DLPack at the API: torch (and JAX, when installed) CPU tensors in without a copy, results back in
the caller's library, bad tensors refused by name. The NumPy path of the same call is the oracle."""
import gc

import numpy as np
import pytest

import moe_cpu
from conftest import make_routing, ref

torch = pytest.importorskip("torch")

E, H, I, K = 4, 64, 32, 2


@pytest.fixture
def layer(rng):
    w13 = rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((E, H, I)).astype(np.float32) * 0.2
    return moe_cpu.quantize_experts(w13, "int8_w8a8"), moe_cpu.quantize_experts(w2, "int8_w8a8")


def routing(rng, M):
    tw, ids = make_routing(rng, M, E, K)
    return tw, ids


def ptr(a):
    return a.ctypes.data


def test_inputs_are_shared_not_copied(rng):
    t = torch.randn(5, H)
    arr, kind = moe_cpu._dlpack.import_array(t, "x")
    assert ptr(arr) == t.data_ptr() and kind == "" and arr.dtype == np.float32 and arr.flags.writeable
    b = torch.randn(5, H).to(torch.bfloat16)
    arr, kind = moe_cpu._dlpack.import_array(b, "x")
    assert ptr(arr) == b.data_ptr() and kind == "bfloat16" and arr.dtype == np.uint16
    np.testing.assert_array_equal(arr, b.view(torch.int16).numpy().view(np.uint16))
    f8 = torch.randn(3, 32).to(torch.float8_e4m3fn)
    arr, kind = moe_cpu._dlpack.import_array(f8, "w")
    assert kind == "float8_e4m3fn" and arr.dtype == np.uint8 and ptr(arr) == f8.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_fused_experts_torch_in_torch_out(rng, layer, dtype, id_dtype):
    w13, w2 = layer
    x = torch.randn(9, H).to(dtype)
    tw, ids = routing(rng, 9)
    got = moe_cpu.fused_experts(x, w13, w2, torch.from_numpy(tw), torch.from_numpy(ids).to(id_dtype))
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == (9, H)
    xn = x.numpy() if dtype == torch.float32 else x.view(torch.int16).numpy().view(np.uint16)
    want = moe_cpu.fused_experts(xn, w13, w2, tw, ids)
    have = got.numpy() if dtype == torch.float32 else got.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(have, want)


def test_out_and_inplace_write_through(rng, layer):
    w13, w2 = layer
    x = torch.randn(6, H)
    tw, ids = routing(rng, 6)
    want = moe_cpu.fused_experts(x.numpy().copy(), w13, w2, tw, ids)
    out = torch.full((6, H), 7.0)
    p = out.data_ptr()
    res = moe_cpu.fused_experts(x, w13, w2, tw, ids, out=out)
    assert res is out and out.data_ptr() == p
    np.testing.assert_array_equal(out.numpy(), want)
    xb = x.clone()
    res = moe_cpu.fused_experts(xb, w13, w2, tw, ids, inplace=True)
    assert res is xb
    np.testing.assert_array_equal(xb.numpy(), want)


def test_select_experts_shared_expert_and_layer(rng, layer):
    w13, w2 = layer
    logits = torch.randn(7, E)
    w, ids = moe_cpu.select_experts(logits, 2, renormalize=True)
    wn, idn = moe_cpu.select_experts(logits.numpy(), 2, renormalize=True)
    assert isinstance(w, torch.Tensor) and ids.dtype == torch.int32
    np.testing.assert_array_equal(w.numpy(), wn)
    np.testing.assert_array_equal(ids.numpy(), idn)
    gate = rng.standard_normal((E, H)).astype(np.float32)
    lay = moe_cpu.MoELayer(gate, w13, w2, top_k=2)
    x = torch.randn(5, H).to(torch.bfloat16)
    y = lay(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    np.testing.assert_array_equal(y.view(torch.int16).numpy().view(np.uint16),
                                  lay(x.view(torch.int16).numpy().view(np.uint16)))
    lf = torch.randn(4, H)   # the layer's other public methods take tensors too
    rw, rid = lay.route(lf)
    assert isinstance(rw, torch.Tensor) and isinstance(lay.router_logits(lf), torch.Tensor)
    np.testing.assert_array_equal(lay.run_experts(lf, rw, rid).numpy(), lay(lf.numpy()))
    np.testing.assert_allclose(lay.reference(lf).numpy(), lay.reference(lf.numpy()))
    s13, s2 = moe_cpu.quantize_experts(rng.standard_normal((1, 2 * I, H)).astype(np.float32), "bf16"), \
        moe_cpu.quantize_experts(rng.standard_normal((1, H, I)).astype(np.float32), "bf16")
    xf = torch.randn(3, H)
    f = torch.randn(3, H)
    got = moe_cpu.shared_expert(xf, s13, s2, f, 2.0)
    np.testing.assert_array_equal(got.numpy(), moe_cpu.shared_expert(xf.numpy(), s13, s2, f.numpy(), 2.0))


def test_packing_from_torch(rng):
    q = torch.randint(-8, 8, (2, 16, 64), dtype=torch.int8)
    s = (torch.rand(2, 16, 2) + 0.5).to(torch.bfloat16)
    p = moe_cpu.pack_int4(q, s, 32)
    want = moe_cpu.pack_int4(q.numpy(), s.view(torch.int16).numpy().view(np.uint16), 32)
    np.testing.assert_array_equal(p.unpack(), want.unpack())
    w = torch.randn(2, 16, 64).to(torch.float8_e4m3fn)
    si = torch.rand(2, 1, 1) + 0.5
    p8 = moe_cpu.pack_fp8(w, si, (16, 64))
    np.testing.assert_array_equal(p8.unpack_quantized()["weight"], w.view(torch.uint8).numpy())
    wf = torch.randn(2, 16, 64)
    np.testing.assert_array_equal(moe_cpu.quantize_experts(wf, "int8_w8a8").unpack(),
                                  moe_cpu.quantize_experts(wf.numpy(), "int8_w8a8").unpack())
    bf = torch.randn(2, 16, 64).to(torch.bfloat16)
    np.testing.assert_array_equal(moe_cpu.pack_bf16(bf).unpack(), bf.float().numpy())


def test_producer_freed_right_after_the_call(rng, layer):
    """The call holds the producer's tensor only while it runs: deleting it afterwards (and
    collecting) must leave the result intact, and the result must not alias freed memory."""
    w13, w2 = layer
    tw, ids = routing(rng, 8)
    x = torch.randn(8, H)
    want = moe_cpu.fused_experts(x.numpy().copy(), w13, w2, tw, ids)
    y = moe_cpu.fused_experts(x, w13, w2, torch.from_numpy(tw), torch.from_numpy(ids))
    del x
    gc.collect()
    _ = [torch.randn(8, H) for _ in range(50)]   # reuse the freed memory
    np.testing.assert_array_equal(y.numpy(), want)
    y2 = moe_cpu.fused_experts(torch.randn(8, H).to(torch.bfloat16), w13, w2, tw, ids)   # a temporary
    assert y2.dtype == torch.bfloat16 and torch.isfinite(y2.float()).all()


class Producer:
    """A DLPack producer with a chosen device / capsule kind around a torch tensor or NumPy array."""

    def __init__(self, a, device=(1, 0), legacy=False):
        self.a, self.device, self.legacy = a, device, legacy

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *args, **kwargs):
        if self.legacy:
            if kwargs:
                raise TypeError("legacy producer: no keyword arguments")
            return torch.utils.dlpack.to_dlpack(self.a)
        return self.a.__dlpack__(*args, **kwargs)


def test_legacy_capsule_and_numpy_producer(rng, layer):
    w13, w2 = layer
    tw, ids = routing(rng, 4)
    x = torch.randn(4, H)
    want = moe_cpu.fused_experts(x.numpy(), w13, w2, tw, ids)
    np.testing.assert_array_equal(np.asarray(moe_cpu.fused_experts(Producer(x, legacy=True), w13, w2, tw, ids)), want)
    arr, _ = moe_cpu._dlpack.import_array(Producer(x.numpy()), "x")   # NumPy's own versioned capsule
    assert ptr(arr) == x.data_ptr()


def test_bad_tensors_raise_by_name(rng, layer):
    w13, w2 = layer
    tw, ids = routing(rng, 4)
    with pytest.raises(ValueError, match="hidden_states is not C-contiguous"):
        moe_cpu.fused_experts(torch.randn(H, 4).t(), w13, w2, tw, ids)
    with pytest.raises(ValueError, match="hidden_states is on DLPack device type 2, not the CPU"):
        moe_cpu.fused_experts(Producer(torch.randn(4, H), device=(2, 0)), w13, w2, tw, ids)
    with pytest.raises(TypeError, match="hidden_states"):
        moe_cpu.fused_experts(torch.randn(4, H, dtype=torch.float64), w13, w2, tw, ids)
    with pytest.raises(TypeError, match="router_logits has a DLPack element type"):
        moe_cpu.select_experts(torch.randn(4, E, dtype=torch.complex64), 2)
    ro = np.zeros((4, H), np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="out is read-only"):
        moe_cpu.fused_experts(torch.randn(4, H), w13, w2, tw, ids, out=Producer(ro))
    with pytest.raises(TypeError, match="topk_ids"):
        moe_cpu.fused_experts(torch.randn(4, H), w13, w2, tw, torch.from_numpy(ids).to(torch.int16))
    # tensors torch will not export are named (torch's BufferError / ValueError as the reason)
    with pytest.raises(TypeError, match=r"hidden_states: this torch array cannot be read through DLPack \(.*gradient"):
        moe_cpu.fused_experts(torch.randn(4, H, requires_grad=True), w13, w2, tw, ids)
    with pytest.raises(TypeError, match="hidden_states: this torch array cannot be read through DLPack"):
        moe_cpu.fused_experts(torch.randn(4, H).to_sparse(), w13, w2, tw, ids)
    with pytest.raises(ValueError, match="hidden_states: this torch array cannot be read through DLPack"):
        moe_cpu.fused_experts(torch.empty(4, H, device="meta"), w13, w2, tw, ids)
    # a bfloat16 tensor where float32 is needed is called bfloat16, not by its bits' uint16
    with pytest.raises(TypeError, match="topk_weights must have dtype float32, got bfloat16"):
        moe_cpu.fused_experts(torch.randn(4, H), w13, w2, torch.from_numpy(tw).bfloat16(), ids)
    with pytest.raises(TypeError, match="router_logits must have dtype float32, got bfloat16"):
        moe_cpu.select_experts(torch.randn(4, E).bfloat16(), 2)


def test_jax_arrays(rng, layer):
    jnp = pytest.importorskip("jax.numpy")
    w13, w2 = layer
    tw, ids = routing(rng, 5)
    x = rng.standard_normal((5, H)).astype(np.float32)
    want = moe_cpu.fused_experts(x, w13, w2, tw, ids)
    got = moe_cpu.fused_experts(jnp.asarray(x), w13, w2, jnp.asarray(tw), jnp.asarray(ids))
    assert type(got).__module__.startswith(("jax", "jaxlib"))
    np.testing.assert_array_equal(np.asarray(got), want)
    xb = jnp.asarray(x).astype(jnp.bfloat16)
    gb = moe_cpu.fused_experts(xb, w13, w2, tw, ids)
    assert gb.dtype == jnp.bfloat16
    wb = moe_cpu.fused_experts(ref.float_to_bf16_bits(np.asarray(xb.astype(jnp.float32))), w13, w2, tw, ids)
    np.testing.assert_array_equal(np.asarray(gb.astype(jnp.float32)), ref.bf16_bits_to_float(wb))
