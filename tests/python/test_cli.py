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


def test_bench_writes_json(tmp_path):
    path = tmp_path / "b.json"
    out = run_cli(tmp_path, "bench", "--experts", "8", "--tokens", "1,4", "--schemes", "int8_w8a8,bf16",
                  "--min-time", "0.05", "--out", str(path))
    assert "tokens/s" in out
    data = json.loads(path.read_text())
    assert data["shape"] == dict(H=2048, I=768, E=8, k=8)
    rows = {(r["scheme"], r["M"]): r for r in data["rows"]}
    assert set(rows) == {(s, m) for s in ("int8_w8a8", "bf16") for m in (1, 4)}
    for r in rows.values():
        assert r["ms"] > 0 and r["tokens_per_s"] > 0 and r["weight_gbs"] > 0
        assert r["kernel"] == moe_cpu.cpu_features()["kernels"][r["scheme"]]


@pytest.mark.parametrize("args", [["bench", "--schemes", "int3"], ["bench", "--tokens", "0"], ["nope"], []])
def test_bad_arguments_exit_2(args):
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    assert e.value.code == 2


def test_bench_topk_above_experts(tmp_path, capsys):
    assert cli.main(["bench", "--experts", "4", "--topk", "8", "--out", str(tmp_path / "x.json")]) == 2
    assert "--topk" in capsys.readouterr().err
