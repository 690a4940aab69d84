"""Thread safety and determinism: concurrent calls on shared packed weights, any thread count."""
import threading

import numpy as np
import pytest

import moe_cpu
from conftest import SCHEME_CONFIGS, make_input, make_moe, make_routing

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)


@pytest.mark.parametrize("name", ["int4_g32", "int8", "fp8_128", "bf16"])
def test_eight_python_threads_match_single_threaded_bits(rng, name):
    E, H, I, M, k = 6, 128, 96, 37, 3
    _, w13, _, w2 = make_moe(rng, SCHEME_CONFIGS[name], E, H, I)
    inputs = [make_input(rng, M, H) for _ in range(8)]
    routes = [make_routing(rng, M, E, k) for _ in range(8)]
    want = [moe_cpu.fused_experts(x, w13, w2, tw, ids) for x, (tw, ids) in zip(inputs, routes)]
    got = [None] * 8
    barrier = threading.Barrier(8)

    def work(i):
        barrier.wait()
        for _ in range(5):
            got[i] = moe_cpu.fused_experts(inputs[i], w13, w2, *routes[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        np.testing.assert_array_equal(got[i], want[i])


@pytest.mark.parametrize("name", ["int4_g128", "int4_g32", "int8", "fp8_128", "fp8_32x64", "bf16"])
def test_output_bits_do_not_depend_on_thread_count(rng, name):
    E, H, I, M, k = 8, 256, 128, 300, 4
    _, w13, _, w2 = make_moe(rng, SCHEME_CONFIGS[name], E, H, I)
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    saved = moe_cpu.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            moe_cpu.set_num_threads(n)
            outs.append(moe_cpu.fused_experts(x, w13, w2, tw, ids))
    finally:
        moe_cpu.set_num_threads(saved)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_thread_count_bounds():
    """1024 threads are allowed (or the processor count where larger); more raise before OpenMP tries."""
    import os
    top = max(1024, len(os.sched_getaffinity(0)))
    saved = moe_cpu.get_num_threads()
    try:
        moe_cpu.set_num_threads(top)
        assert moe_cpu.get_num_threads() == top
        with pytest.raises(ValueError, match=f"must be in \\[1, {top}\\]"):
            moe_cpu.set_num_threads(top + 1)
        assert moe_cpu.get_num_threads() == top
    finally:
        moe_cpu.set_num_threads(saved)


@pytest.mark.parametrize("name", ["int4_g32", "int8", "fp8_128", "bf16"])
@pytest.mark.parametrize("on_input", [False, True])
def test_output_bits_do_not_depend_on_token_chunks(rng, name, on_input):
    """A small scratch limit splits the tokens into chunks (1 token each at 1 byte); every token's
    numbers are computed independently of the others, so the bits must not change."""
    E, H, I, M, k = 8, 128, 96, 61, 3
    _, w13, _, w2 = make_moe(rng, SCHEME_CONFIGS[name], E, H, I)
    x = make_input(rng, M, H)
    tw, ids = make_routing(rng, M, E, k)
    ids[5:9] = -1  # whole tokens skipped: a chunk may have no rows at all
    saved = moe_cpu.get_scratch_limit()
    try:
        outs = []
        for limit in (saved, 1, 20_000):  # one chunk; 61 chunks of 1 token; about 9 chunks
            moe_cpu.set_scratch_limit(limit)
            assert moe_cpu.get_scratch_limit() == limit
            outs.append(moe_cpu.fused_experts(x, w13, w2, tw, ids, apply_router_weight_on_input=on_input))
    finally:
        moe_cpu.set_scratch_limit(saved)
    assert not outs[0][5:9].any()
    amx_float = w13.kernel.endswith("_amx_32x32") and moe_cpu.cpu_features()["amx_min_rows_float"] > 1
    if (w13.kernel.endswith("_reference") or amx_float) and name in ("fp8_128", "bf16"):
        # Eigen's float GEMM blocks by matrix size, so its sums change order with the rows per
        # chunk: the last bits may differ (the SIMD kernels sum each row in a fixed order). The AMX
        # float kernels give an expert with fewer than amx_min_rows_float rows (here, in a chunk) to their
        # AVX-512 twins, which sum in another order (cpp/src/kernels/README.md, "AMX").
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[2], outs[0], rtol=1e-5, atol=1e-6)
        return
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
