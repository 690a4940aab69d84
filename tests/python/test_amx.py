"""AMX from Python: the row threshold between the tiles and their AVX-512 twins changes no bit of the int
schemes, and the crossover bench measures where the CPU has AMX and says why not elsewhere."""
import numpy as np
import pytest

import moe_cpu
from moe_cpu.bench.amx import NEVER, amx_crossover

pytestmark = pytest.mark.isa   # the kernels taken depend on the level


@pytest.mark.parametrize("scheme", ["int4_w4a8", "int8_w8a8"])
def test_int_results_do_not_depend_on_the_amx_threshold(rng, scheme):
    E, k, H, I, M = 8, 2, 128, 96, 160     # 40 rows per expert
    w13 = moe_cpu.quantize_experts(rng.standard_normal((E, 2 * I, H), dtype=np.float32), scheme, group_size=32)
    w2 = moe_cpu.quantize_experts(rng.standard_normal((E, H, I), dtype=np.float32), scheme, group_size=32)
    x = rng.standard_normal((M, H), dtype=np.float32)
    ids = ((np.arange(M)[:, None] * k + np.arange(k)[None, :]) % E).astype(np.int32)
    tw = rng.random((M, k), dtype=np.float32)
    f = moe_cpu.cpu_features()
    before = f["amx_min_rows"] if f["amx_min_rows_set"] else None
    try:
        outs = []
        for rows in (1, NEVER):
            moe_cpu.set_amx_min_rows(rows)
            outs.append(moe_cpu.fused_experts(x, w13, w2, tw, ids))
    finally:
        moe_cpu.set_amx_min_rows(before)
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    want = moe_cpu.fused_experts(x, w13, w2, tw, ids)
    assert np.array_equal(want.view(np.uint32), outs[0].view(np.uint32))


def test_crossover_bench_runs_where_amx_is_active(rng, capsys):
    rows = amx_crossover(rng, schemes=("int8_w8a8",), rows=(1, 32), experts=8, seconds=0.02)
    out = capsys.readouterr().out
    f = moe_cpu.cpu_features()
    if "amx" in f["active"]:
        assert [r["rows"] for r in rows] == [1, 32] and all(r["amx_ms"] > 0 and r["avx512_ms"] > 0 for r in rows)
        assert "crossover:" in out
    else:
        assert rows == [] and "not measured here" in out and f["amx"] in out
    assert moe_cpu.cpu_features() == f   # restored, defaults included

