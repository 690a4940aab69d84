"""moe_cpu.distributed: expert parallelism over MPI. The MPI cases run in `mpirun -np 2` and
`-np 3 --oversubscribe` subprocesses (ep_worker.py, several cases per launch); the placement checks
and the loader's expert subset run here."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import moe_cpu
from moe_cpu.distributed import check_placement, split_experts
from moe_cpu.loaders import load_layer, safetensors_loader
from test_loaders import L, bf16, float_weights, qwen3_config, save_hf

pytestmark = pytest.mark.slow   # subprocesses / torch / mpirun: native level only, not in `test.sh quick`

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ep_worker.py")
CASES = ["match", "placement", "idle_rank", "m0", "errors", "threads"]
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed (scripts/setup.sh installs Open MPI)")


def mpi_env():
    """Open MPI refuses root unless told; the package under test is the installed one."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    env.pop("OMP_NUM_THREADS", None)
    return env


def mpirun(np_, *args, timeout=120, oversubscribe=False, cwd=None):
    cmd = [MPIRUN, "-np", str(np_)] + (["--oversubscribe"] if oversubscribe else []) + \
          [sys.executable, "-m", "mpi4py", *args]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env(), cwd=cwd)
    return res, time.monotonic() - t0


def qwen3_checkpoint(d, rng, E=6, H=64, I=32, qwen2_shared=0):
    """Qwen3-MoE, or with qwen2_shared = Is a Qwen2-MoE one with a gated shared expert of that size."""
    tensors = {}
    for layer in range(3):
        pre = f"model.layers.{layer}.mlp."
        tensors[pre + "gate.weight"] = bf16(float_weights(rng, 1, E, H)[0])
        for e in range(E):
            for p, (N, K) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                tensors[f"{pre}experts.{e}.{p}.weight"] = bf16(float_weights(rng, 1, N, K)[0])
        if qwen2_shared:
            Is = qwen2_shared
            tensors[pre + "shared_expert_gate.weight"] = bf16(float_weights(rng, 1, 1, H)[0])
            for p, (N, K) in (("gate_proj", (Is, H)), ("up_proj", (Is, H)), ("down_proj", (H, Is))):
                tensors[f"{pre}shared_expert.{p}.weight"] = bf16(float_weights(rng, 1, N, K)[0])
    if qwen2_shared:
        return save_hf(d, qwen3_config(E, H, I, model_type="qwen2_moe", shared_expert_intermediate_size=qwen2_shared),
                       tensors)
    return save_hf(d, qwen3_config(E, H, I), tensors)


def assert_all_ok(res, ranks, cases):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for r in range(ranks):
        for c in cases:
            assert f"rank {r} ok {c}" in res.stdout, (r, c, res.stdout)


# ------------------------------------------------------------------------------- under mpirun
@needs_mpirun
def test_two_ranks_all_cases(tmp_path, rng):
    ck = qwen3_checkpoint(tmp_path / "q3", rng)
    res, _ = mpirun(2, WORKER, *CASES, "checkpoint", "--checkpoint", str(ck), cwd=tmp_path)
    assert_all_ok(res, 2, CASES + ["checkpoint"])
    assert "routed bytes per rank" in res.stdout


@needs_mpirun
def test_three_ranks_oversubscribed(tmp_path, rng):
    # 7 experts over 3 ranks (2, 2, 3); Qwen2-MoE: rank 0 also runs the sigmoid-gated shared expert
    ck = qwen3_checkpoint(tmp_path / "q3", rng, E=7, qwen2_shared=48)
    res, _ = mpirun(3, WORKER, *CASES, "checkpoint", "--checkpoint", str(ck), oversubscribe=True, cwd=tmp_path)
    assert_all_ok(res, 3, CASES + ["checkpoint"])


@needs_mpirun
def test_rank_raising_outside_a_call_aborts_the_job(tmp_path):
    """Rank 1 raises while rank 0 waits in the layer's all-reduce: `python -m mpi4py` turns the
    unhandled exception into MPI_Abort, so mpirun ends (non-zero) well within the timeout."""
    res, took = mpirun(2, WORKER, "abort", timeout=60, cwd=tmp_path)
    assert res.returncode != 0 and took < 30, (res.returncode, took)
    assert "ok" not in res.stdout   # rank 0 never returned from the call it was waiting in


# ----------------------------------------------------------------------------------- in process
def test_import_moe_cpu_does_not_import_mpi4py(tmp_path):
    code = "import sys, moe_cpu, moe_cpu.distributed; assert 'mpi4py' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, timeout=60)


def test_split_and_placement_checks():
    assert split_experts(7, 3) == ((0, 1), (2, 3), (4, 5, 6))   # the larger shares on the last ranks
    assert split_experts(256, 8)[0] == tuple(range(32))
    assert check_placement([1, 0, 1], 3, 2) == ((1,), (0, 2))
    assert check_placement([[2], [0, 1], []], 3, 3) == ((2,), (0, 1), ())
    for bad, err, needle in [([[0, 1], [1, 2]], ValueError, "two ranks"), ([[0], [2]], ValueError, "on no rank"),
                             ([[0, 1, 2]], ValueError, "2 ranks"), ([[0, 1], [2, 3]], ValueError, "outside [0, 3)"),
                             ([0, 2, 1], ValueError, "outside [0, 2)"), ([0, 1], ValueError, "2 experts"),
                             ("01", TypeError, "placement"), ([[0, 1.5], [2]], TypeError, "ints")]:
        with pytest.raises(err, match=None) as e:
            check_placement(bad, 3, 2)
        assert needle in str(e.value), (bad, str(e.value))
    with pytest.raises(ValueError, match="E must be >= ranks"):
        check_placement(None, 2, 3)


def test_comm_of_wrong_type_raises():
    from moe_cpu.distributed import EPMoELayer
    g = np.zeros((4, 64), np.float32)
    with pytest.raises(TypeError, match="mpi4py intracommunicator"):
        EPMoELayer.from_float(g, np.zeros((4, 64, 64), np.float32), np.zeros((4, 64, 32), np.float32),
                              comm="COMM_WORLD", top_k=2, scheme="int8_w8a8")


def test_loading_a_subset_reads_only_those_experts(tmp_path, rng, monkeypatch):
    """load_layer(experts=...) reads no tensor of another expert, and packs ~|subset|/E of the bytes."""
    E = 6
    ck = qwen3_checkpoint(tmp_path / "q3", rng, E=E)
    names = []
    real = safetensors_loader._Checkpoint.read
    monkeypatch.setattr(safetensors_loader._Checkpoint, "read",
                        lambda self, name, *a, **k: names.append(name) or real(self, name, *a, **k))
    full = load_layer(ck, L, "int8_w8a8")
    names.clear()
    sub = load_layer(ck, L, "int8_w8a8", experts=[4, 1])
    read = {int(n.split(".experts.")[1].split(".")[0]) for n in names if ".experts." in n}
    assert read == {1, 4}
    assert sub.w13.num_experts == 2 and sub.experts == (4, 1)
    assert sub.w13.nbytes + sub.w2.nbytes == pytest.approx((full.w13.nbytes + full.w2.nbytes) * 2 / E)
    for got, want in ((sub.w13, full.w13), (sub.w2, full.w2)):   # codes as in the full load, in that order
        g, w = got.unpack_quantized(), want.unpack_quantized()
        np.testing.assert_array_equal(g["qweight"], w["qweight"][[4, 1]])
        np.testing.assert_array_equal(g["scales"], w["scales"][[4, 1]])
    with pytest.raises(ValueError, match="out of range"):
        load_layer(ck, L, "int8_w8a8", experts=[6])
    with pytest.raises(ValueError, match="distinct"):
        load_layer(ck, L, "int8_w8a8", experts=[1, 1])
    with pytest.raises(ValueError, match="subset of the experts"):
        moe_cpu.MoELayer.from_weights(sub)


# ----------------------------------------------------------------------------------- command line
@needs_mpirun
def test_cli_run_ep_and_bench_ep(tmp_path, rng):
    """`mpirun -np 2 moe-cpu run --ep` (error vs the float64 layer) and `moe-cpu bench --ep` (rows)."""
    ck = qwen3_checkpoint(tmp_path / "q3", rng)
    res, _ = mpirun(2, "-m", "moe_cpu", "run", "--ep", "--checkpoint", str(ck), "--layer", str(L), "--tokens", "8",
                    "--scheme", "int8_w8a8", "--calls", "2", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(s for s in res.stdout.splitlines() if "relative L2 error" in s)
    assert "on 2 ranks" in line and float(line.split("float64 ")[1].split(",")[0]) < 0.05, line
    assert res.stdout.count("EPMoELayer(E=6") == 2   # rank 0 prints every rank's share
    res, _ = mpirun(2, "-m", "moe_cpu", "bench", "--ep", "--shapes", "qwen3-30b-a3b", "--experts", "8", "--m", "1,3",
                    "--calls", "1", "--sweep", "4,64", "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((tmp_path / "b" / "bench_ep_2ranks.json").read_text())
    assert [r["M"] for r in data["rows"]] == [1, 3] and data["ranks"] == 2
    for r in data["rows"]:
        assert r["experts_per_rank"] == [4, 4] and r["ms"] > 0 and 0 <= r["allreduce_share"]
        assert r["allreduce_bytes"] == r["M"] * 2048 * 4
    assert data["alpha_s"] is not None
