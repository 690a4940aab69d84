"""The moe-cpu command line, run as `python -m moe_cpu` in a subprocess (outside the source tree)."""
import json
import subprocess
import sys

import pytest

import moe_cpu
from moe_cpu import cli


def run_cli(tmp_path, *args):
    res = subprocess.run([sys.executable, "-m", "moe_cpu", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_info_names_each_kernel(tmp_path):
    out = run_cli(tmp_path, "info")
    for scheme, kernel in moe_cpu.cpu_features()["kernels"].items():
        assert any(scheme in line and kernel in line for line in out.splitlines()), (scheme, kernel, out)
    assert moe_cpu.__version__ in out and "threads" in out
    for k in moe_cpu._core.registered_kernels():
        assert k["name"] in out


def test_bench_writes_json_and_plot(tmp_path):
    out = run_cli(tmp_path, "bench", "--shapes", "qwen3-30b-a3b", "--experts", "8", "--m", "1,4",
                  "--schemes", "int8_w8a8,bf16", "--no-peers", "--out", str(tmp_path / "b"))
    assert "paired decode ratio" in out and "vpdpbusd" in out
    data = json.loads((tmp_path / "b" / "bench_moe.json").read_text())
    assert (tmp_path / "b" / "bench_moe.png").stat().st_size > 0
    assert data["limits"]["read_gbs"] > 0
    rows = {(r["scheme"], r["M"]): r for r in data["rows"]}
    assert set(rows) == {(s, m) for s in ("int8_w8a8", "bf16") for m in (1, 4)}
    for r in rows.values():
        assert r["ms"] > 0 and r["tok_s"] > 0 and r["gbs"] > 0
        assert r["kernel"] == moe_cpu.cpu_features()["kernels"][r["scheme"]]


@pytest.mark.parametrize("args", [["bench", "--schemes", "int3"], ["bench", "--m", "0"], ["nope"], []])
def test_bad_arguments_exit_2(args):
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    assert e.value.code == 2


def test_bench_topk_above_experts(tmp_path, capsys):
    assert cli.main(["bench", "--shapes", "qwen3-30b-a3b", "--experts", "4", "--no-peers",
                     "--out", str(tmp_path / "x")]) == 2
    assert "--experts 4" in capsys.readouterr().err
