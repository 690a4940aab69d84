"""Thread safety and determinism: concurrent calls on shared packed weights, any thread count."""
import threading

import numpy as np
import pytest

import moe_cpu
from conftest import SCHEME_CONFIGS, make_input, make_moe, make_routing


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
