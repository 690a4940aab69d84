"""moe_cpu's compute team (docs/threads.md): the default team, OpenMP's on request or with binding, the same bits
from both, a fork() child that still computes, more threads than cores; and the contention / scaling benches
refuse bad counts with a usage error (and bench/builds_ab.py bad builds)."""
import multiprocessing as mp
import os
import subprocess
import sys

import numpy as np
import pytest

import moe_cpu
from conftest import SCHEME_CONFIGS, make_input, make_moe, make_routing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_py(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("MOE_CPU_TEAM", "MOE_CPU_SPIN_US", "OMP_PROC_BIND",
                                                          "OMP_PLACES")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
@pytest.mark.parametrize("env,want", [
    ({}, "moe_cpu (idle workers poll 200 us, then sleep)"),
    ({"MOE_CPU_SPIN_US": "50"}, "moe_cpu (idle workers poll 50 us, then sleep)"),
    ({"MOE_CPU_TEAM": "moe_cpu", "MOE_CPU_SPIN_US": "0"}, "moe_cpu (idle workers poll 0 us, then sleep)"),
    ({"MOE_CPU_TEAM": "omp"}, "openmp (MOE_CPU_TEAM=omp)"),
    ({"OMP_PLACES": "cores"}, "openmp (OMP_PROC_BIND / OMP_PLACES set: OpenMP binds the threads)"),
])
def test_which_team(env, want):
    out = run_py("import moe_cpu; print(moe_cpu.compute_team())", **env)
    assert out.returncode == 0 and out.stdout.strip() == want, out.stderr[-2000:]


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
@pytest.mark.parametrize("env,needle", [
    ({"MOE_CPU_TEAM": "tbb"}, "MOE_CPU_TEAM = 'tbb' must be 'moe_cpu' (the default) or 'omp'"),
    ({"MOE_CPU_SPIN_US": "-1"}, "MOE_CPU_SPIN_US = '-1' must be an integer in [0, 1000000]"),
    ({"MOE_CPU_SPIN_US": "2e3"}, "MOE_CPU_SPIN_US = '2e3' must be an integer in [0, 1000000]"),
])
def test_bad_team_settings_fail_the_import_by_name(env, needle):
    out = run_py("import moe_cpu", **env)
    assert out.returncode != 0 and needle in out.stderr, out.stderr[-2000:]


CALL = """
import numpy as np, moe_cpu, sys
sys.path.insert(0, {tests!r})
from conftest import SCHEME_CONFIGS, make_input, make_moe, make_routing
moe_cpu.set_num_threads({threads})
rng = np.random.default_rng(7)
_, w13, _, w2 = make_moe(rng, SCHEME_CONFIGS["int4_g32"], 6, 128, 96)
x = make_input(rng, 37, 128)
tw, ids = make_routing(rng, 37, 6, 3)
np.save({out!r}, moe_cpu.fused_experts(x, w13, w2, tw, ids))
"""


@pytest.mark.parametrize("threads", [2, 3])
def test_both_teams_give_the_same_bits(tmp_path, threads):
    tests = os.path.dirname(os.path.abspath(__file__))
    got = {}
    for team in ("moe_cpu", "omp"):
        out = str(tmp_path / f"{team}.npy")
        res = run_py(CALL.format(tests=tests, threads=threads, out=out), MOE_CPU_TEAM=team)
        assert res.returncode == 0, res.stderr[-2000:]
        got[team] = np.load(out)
    np.testing.assert_array_equal(got["moe_cpu"], got["omp"])


def _child(conn, w13, w2, x, tw, ids):
    conn.send(moe_cpu.fused_experts(x, w13, w2, tw, ids))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Python's own note on fork() in a threaded process
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX's (imported by other tests), the same note
def test_a_fork_child_still_computes(rng):
    """The parent's team threads do not exist in a fork() child: its first call makes a team of its own."""
    _, w13, _, w2 = make_moe(rng, SCHEME_CONFIGS["int8"], 6, 128, 96)
    x = make_input(rng, 37, 128)
    tw, ids = make_routing(rng, 37, 6, 3)
    moe_cpu.set_num_threads(2)
    want = moe_cpu.fused_experts(x, w13, w2, tw, ids)  # the parent's team exists now
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_child, args=(b, w13, w2, x, tw, ids))
    p.start()
    assert a.poll(120), "the fork child hung"
    got = a.recv()
    p.join(30)
    np.testing.assert_array_equal(got, want)


def test_more_threads_than_cores_give_the_same_bits(rng):
    _, w13, _, w2 = make_moe(rng, SCHEME_CONFIGS["int4_g128"], 8, 256, 128)
    x = make_input(rng, 300, 256)
    tw, ids = make_routing(rng, 300, 8, 4)
    before = moe_cpu.get_num_threads()
    try:
        moe_cpu.set_num_threads(1)
        want = moe_cpu.fused_experts(x, w13, w2, tw, ids)
        moe_cpu.set_num_threads(4 * (os.cpu_count() or 1))
        np.testing.assert_array_equal(moe_cpu.fused_experts(x, w13, w2, tw, ids), want)
    finally:
        moe_cpu.set_num_threads(before)


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
@pytest.mark.parametrize("script,args,needle", [
    ("contention.py", ["--neighbours", "-1"], "a neighbour count must be >= 0"),
    ("contention.py", ["--neighbours", "x"], "comma-separated integers"),
    ("contention.py", ["--m", "0"], "token counts must be >= 1"),
    ("contention.py", ["--threads", "0"], "num_threads = 0 must be in [1,"),
    ("scaling.py", ["--threads", "0"], "must be >= 1"),
    ("scaling.py", ["--threads", "two"], "integers or 'all'"),
    ("team_ab.py", ["--rounds", "0"], "must be >= 1"),
    ("builds_ab.py", ["--old", "/", "--new", "/", "--rounds", "0"], "must be >= 1"),
    ("builds_ab.py", ["--old", "/nonexistent", "--new", "/"], "/nonexistent holds no moe_cpu package"),
    ("builds_ab.py", ["--old", ROOT, "--new", ROOT, "--new-env", "MOE_CPU_ISA"], "take NAME=VALUE"),
])
def test_benches_refuse_bad_counts(script, args, needle):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and needle in out.stderr, out.stderr[-2000:]


def test_neighbours_refuse_negative_counts():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import contention
    finally:
        sys.path.pop(0)
    with pytest.raises(ValueError, match="neighbours = -2 must be >= 0"):
        contention.Neighbours(-2)


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
def test_contention_spin_reference_runs():
    # --spin-ref adds one row per case for a single thread of fixed work (bench/contention.py); 5 quiet calls.
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "contention.py"), "--m", "1", "--neighbours", "0",
                          "--calls", "5", "--spin-ref"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines() if ln.strip() and not ln.startswith("#")}
    assert set(rows) == {"moe_cpu", "spin-1t"}, out.stdout
    for r in rows.values():  # engine M neighbours | p10 p50 p90 | p50/quiet p90/quiet
        assert r[1:3] == ["1", "0"] and all(float(v) > 0 for v in r[4:7]) and r[8] == "1.00", r
