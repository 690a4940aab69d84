"""Property test: random shapes and options, the dispatched path (SIMD where the CPU has it)
against the NumPy reference at the named tolerances."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import moe_cpu
from conftest import SCHEME_CONFIGS, assert_close, make_input, make_moe, make_routing, ref

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

ACTS = list(ref.ACTIVATIONS)


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(SCHEME_CONFIGS)))
    cfg = SCHEME_CONFIGS[name]
    g = cfg.get("group_size") or 0
    if cfg["scheme"] == "int4_w4a8":
        unit = 32 if g in (None, 0, -1) else g
    else:
        unit = g if g > 0 else 1
    H = unit * draw(st.integers(1, 4)) if unit > 1 else draw(st.integers(1, 200))
    I = unit * draw(st.integers(1, 3)) if unit > 1 else draw(st.integers(1, 150))
    if cfg["scheme"] == "int4_w4a8" and g in (None, 0):   # default group 128 needs multiples of 128
        H, I = 128 * max(1, H // 128), 128 * max(1, I // 128)
    E = draw(st.integers(1, 6))
    k = draw(st.integers(1, E))
    M = draw(st.integers(0, 40))
    return dict(name=name, H=H, I=I, E=E, k=k, M=M, act=draw(st.sampled_from(ACTS)),
                on_input=draw(st.booleans()), bias=draw(st.booleans()), neg=draw(st.booleans()),
                dtype=draw(st.sampled_from(["float32", "bfloat16"])), seed=draw(st.integers(0, 2**31)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_dispatched_path_matches_reference(c):
    rng = np.random.default_rng(c["seed"])
    cfg = SCHEME_CONFIGS[c["name"]]
    w13r, w13p, w2r, w2p = make_moe(rng, cfg, c["E"], c["H"], c["I"])
    x = make_input(rng, c["M"], c["H"], c["dtype"])
    tw, ids = make_routing(rng, c["M"], c["E"], c["k"])
    if c["neg"] and c["M"]:
        ids[rng.random(ids.shape) < 0.2] = -1
    b13 = rng.standard_normal((c["E"], 2 * c["I"])).astype(np.float32) if c["bias"] else None
    b2 = rng.standard_normal((c["E"], c["H"])).astype(np.float32) if c["bias"] else None
    got = moe_cpu.fused_experts(x, w13p, w2p, tw, ids, activation=c["act"], apply_router_weight_on_input=c["on_input"],
                                w13_bias=b13, w2_bias=b2)
    want = ref.fused_experts_ref(x, w13r, w2r, tw, ids, activation=c["act"], apply_router_weight_on_input=c["on_input"],
                                 w13_bias=b13, w2_bias=b2)
    assert got.dtype == x.dtype
    assert_close(got, want, cfg["scheme"], str(c))
