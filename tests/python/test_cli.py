"""The moe-cpu command line, run as `python -m moe_cpu` in a subprocess (outside the source tree)."""
import importlib.util
import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import moe_cpu
from moe_cpu import cli
from moe_cpu.bench import kt_peer, onednn_peer, peaks, peers, random_forms

pytestmark = pytest.mark.slow   # subprocesses / torch / mpirun: native level only, not in `test.sh quick`

PEAK_WHAT = {p["name"]: p["what"] for p in moe_cpu._core.peak_instructions()}


def run_cli(tmp_path, *args, env=None):
    res = subprocess.run([sys.executable, "-m", "moe_cpu", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_info_names_each_kernel(tmp_path):
    out = run_cli(tmp_path, "info")
    for scheme, kernel in moe_cpu.cpu_features()["kernels"].items():
        assert any(scheme in line and kernel in line for line in out.splitlines()), (scheme, kernel, out)
    assert moe_cpu.__version__ in out and "threads" in out
    assert f"tier:              {peaks.tier()}" in out
    for k in moe_cpu._core.registered_kernels():
        assert k["name"] in out


def check_bench_json(out, data, schemes, ms):
    """The header names the tier and each scheme's peak instruction; rows are complete."""
    kernels = moe_cpu.cpu_features()["kernels"]
    assert f"tier {peaks.tier()}" in out and "paired decode ratio" in out
    assert data["limits"]["read_gbs"] > 0 and data["limits"]["tier"] == peaks.tier()
    rows = {(r["scheme"], r["M"]): r for r in data["rows"]}
    assert set(rows) == {(s, m) for s in schemes for m in ms}
    for r in rows.values():
        assert r["ms"] > 0 and r["tok_s"] > 0 and r["gbs"] > 0
        assert r["kernel"] == kernels[r["scheme"]]
        insn = peaks.peak_insn(r["kernel"])
        assert r["peak_insn"] == insn
        if insn is None:
            assert r["pct_peak"] is None and "no SIMD peak" in out
        else:
            assert data["limits"]["peaks_tops"][insn] > 0 and r["pct_peak"] > 0
            assert PEAK_WHAT[insn] in out


def test_bench_writes_json_and_plot(tmp_path):
    out = run_cli(tmp_path, "bench", "--shapes", "qwen3-30b-a3b", "--experts", "8", "--m", "1,4",
                  "--schemes", "int8_w8a8,bf16", "--no-peers", "--kt-peer", "--amx-crossover", "--out", str(tmp_path / "b"))
    data = json.loads((tmp_path / "b" / "bench_moe.json").read_text())
    assert (tmp_path / "b" / "bench_moe.png").stat().st_size > 0
    check_bench_json(out, data, ("int8_w8a8", "bf16"), (1, 4))
    if data["kt_peer"]:  # --kt-peer: rows where kt-kernel runs, else [] and a line saying why
        check_kt_rows(data["kt_peer"], data["limits"]["threads"], ("int8_w8a8", "bf16"), (1, 4))
    else:
        assert "kt-kernel peer: " in out
    if "amx" in moe_cpu.cpu_features()["active"]:
        assert {r["scheme"] for r in data["amx_crossover"]} == {"int8_w8a8", "bf16"} and "crossover:" in out
    else:
        assert data["amx_crossover"] == [] and "AMX crossover: not measured here" in out


def test_bench_at_reference_level_says_no_simd_peak(tmp_path):
    env = dict(os.environ, MOE_CPU_ISA="reference")
    out = run_cli(tmp_path, "bench", "--shapes", "qwen3-30b-a3b", "--experts", "8", "--m", "1",
                  "--schemes", "fp8_w8a16", "--no-peers", "--out", str(tmp_path / "r"), env=env)
    data = json.loads((tmp_path / "r" / "bench_moe.json").read_text())
    assert "tier reference" in out and "no SIMD peak" in out and data["limits"]["peaks_tops"] == {}
    assert data["rows"][0]["kernel"] == "fp8w_reference" and data["rows"][0]["pct_peak"] is None


def test_every_simd_kernel_has_a_measurable_peak():
    """Each x86 SIMD kernel maps to the instruction its inner loop uses, and that peak is measurable
    exactly when the CPU has the instruction."""
    x86 = platform.machine() in ("x86_64", "AMD64")
    for k in moe_cpu._core.registered_kernels():
        insn = peaks.peak_insn(k["name"])
        if k["isa"] in ("reference", "amx_model") or not x86:
            assert insn is None, k["name"]
        else:
            assert insn in PEAK_WHAT, k["name"]
    detected = set(moe_cpu.cpu_features()["detected"])
    for p in moe_cpu._core.peak_instructions():
        if p["available"]:
            assert moe_cpu._core.instruction_peak_tops(p["name"], 1, 0.02) > 0
        else:
            with pytest.raises(ValueError, match="this CPU lacks"):
                moe_cpu._core.instruction_peak_tops(p["name"], 1, 0.02)
        need = {"vpdpbusd_zmm": "avx512_vnni", "vdpbf16ps_zmm": "avx512_bf16", "vpdpbusd_ymm": "avx_vnni",
                "maddubs_ymm": "avx2", "fma_ymm": "avx2", "tdpbssd_amx": "amx", "tdpbf16ps_amx": "amx",
                "vpdpwssd_zmm": "avx512_vnni", "maddwd_ymm": "avx2"}[p["name"]]
        assert p["available"] == (need in detected), p
    with pytest.raises(ValueError, match="unknown peak instruction"):
        moe_cpu._core.instruction_peak_tops("vfoo", 1, 0.01)


@pytest.mark.parametrize("args", [["bench", "--schemes", "int3"], ["bench", "--m", "0"], ["nope"], []])
def test_bad_arguments_exit_2(args):
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    assert e.value.code == 2


def test_bench_topk_above_experts(tmp_path, capsys):
    assert cli.main(["bench", "--shapes", "qwen3-30b-a3b", "--experts", "4", "--no-peers",
                     "--out", str(tmp_path / "x")]) == 2
    assert "--experts 4" in capsys.readouterr().err


@pytest.mark.parametrize("args,says", [
    (["--experts", "-5"], "--experts -5 must be >= 0"),
    (["--experts", "1000000", "--schemes", "bf16"], "needs about 17578.1 GiB"),   # 10^6 x 3 x 768 x 2048 x 4 B
])
def test_bench_refuses_a_plan_before_measuring(tmp_path, capsys, args, says):
    """Bad plans fail at once (exit 2, no machine measurement), not after minutes or with a MemoryError."""
    assert cli.main(["bench", "--shapes", "qwen3-30b-a3b", "--m", "1", "--no-peers",
                     "--out", str(tmp_path / "x"), *args]) == 2
    out = capsys.readouterr()
    assert says in out.err and "machine:" not in out.out


def test_bench_out_that_cannot_be_created_exits_2_first(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["bench", "--shapes", "qwen3-30b-a3b", "--experts", "8", "--m", "1", "--no-peers",
                     "--out", str(blocker / "sub")]) == 2
    out = capsys.readouterr()
    assert "cannot be created" in out.err and "machine:" not in out.out


@pytest.mark.parametrize("args,says", [(["--tokens", "0"], "--tokens: must be >= 1"),
                                       (["--topk", "9", "--experts", "8"], "--topk 9 is more than --experts 8"),
                                       (["--hidden", "100"], "multiples of 128")])
def test_demo_bad_arguments_exit_2(capsys, args, says):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", *args])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_demo_small_layer_every_scheme(capsys):
    assert cli.main(["demo", "--hidden", "256", "--inter", "128", "--experts", "4", "--topk", "2", "--tokens", "4",
                     "--repeats", "1"]) == 0
    rows = {line.split()[0]: float(line.split()[2]) for line in capsys.readouterr().out.splitlines()
            if line.split() and line.split()[0] in moe_cpu.SCHEMES}
    assert set(rows) == set(moe_cpu.SCHEMES)
    bound = {"int4_w4a8": 0.3, "int8_w8a8": 0.05, "fp8_w8a16": 0.1, "bf16": 0.01,   # vs the float64 unquantized layer
             "int4_w4a16": 0.3, "int8_w8a16": 0.05}
    assert all(0 < rows[s] < bound[s] for s in rows), rows


def test_torch_peer_says_how_to_get_torch_when_it_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert peers.torch_peer(np.random.default_rng(0), 1) == []
    assert "pip install torch==2.13.0" in capsys.readouterr().out


def test_onednn_peer_says_how_to_get_torch_when_it_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert onednn_peer.onednn_peer(np.random.default_rng(0), 1, ms=(1,), experts=8) == []
    assert "pip install torch==2.13.0" in capsys.readouterr().out


def test_onednn_peer_times_both_engines_against_float64(capsys):
    """torch (a test dependency, scripts/setup.sh): bf16 F.linear and the dynamic int8 Linear per expert, on moe_cpu's
    weights and routing; both engines' errors against float64 near moe_cpu's (their activations per call, ours per
    token). Without torch: [] and how to get it."""
    rows = onednn_peer.onednn_peer(np.random.default_rng(0), moe_cpu.get_num_threads(), ms=(1, 5), experts=8, min_time=0.01)
    if importlib.util.find_spec("torch") is None:
        assert rows == [] and "pip install torch==2.13.0" in capsys.readouterr().out
        return
    import torch
    want = {("bf16", "F.linear bf16")} | {("int8_w8a8", f"dynamic int8 Linear, {e}") for e in onednn_peer.ENGINES
                                           if e in torch.backends.quantized.supported_engines}
    assert {(r["scheme"], r["peer"]) for r in rows} == want and {r["M"] for r in rows} == {1, 5}
    for r in rows:
        assert r["moe_cpu_ms"] > 0 and r["peer_ms"] > 0, r
        bound = 1e-2 if r["scheme"] == "bf16" else 5e-2  # a wrong expert, weight or scale is O(1)
        assert 0 < r["rel_err_moe_cpu"] < bound and 0 < r["rel_err_peer"] < 2 * bound, r
    assert "oneDNN peer through torch" in capsys.readouterr().out


def check_kt_rows(rows, threads, schemes, ms):
    assert {(r["scheme"], r["M"]) for r in rows} == {(s, m) for s in schemes for m in ms}
    for r in rows:
        assert r["moe_cpu_ms"] > 0 and all(r[f"kt_cpuinfer{n}_ms"] > 0 for n in {threads, 1}), r
        # kt's error against float32 is near ours (its own quantization), and kt is close to us
        assert r["kt_agrees"] and r["rel_err_kt"] < max(2 * r["rel_err_moe_cpu"], 0.02), r
        assert r["rel_err_kt_vs_moe_cpu"] < {"bf16": 0.02, "int8_w8a8": 0.05, "int4_w4a8": 0.3, "int4_w4a16": 0.05}[r["scheme"]], r


def test_kt_peer_says_how_to_get_kt_kernel_when_it_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "kt_kernel", None)  # find_spec("kt_kernel") -> None: not installed
    assert kt_peer.kt_peer(np.random.default_rng(0), 2, ms=(1,), experts=8) == []
    assert "pip install kt-kernel==0.7.2 --no-deps" in capsys.readouterr().out


def test_kt_peer_times_and_matches_moe_cpu_where_kt_kernel_runs(capsys):
    """Installed (pip install kt-kernel==0.7.2 --no-deps): both timings and a small error per row; else []."""
    threads = moe_cpu.get_num_threads()
    rows = kt_peer.kt_peer(np.random.default_rng(0), threads, ms=(1, 3), experts=8, min_time=0.02)
    out = capsys.readouterr().out
    # kt's module sets flush-to-zero / denormals-are-zero when loaded; the peer puts this thread's mode back
    assert np.float32(2.0 ** -126) * np.float32(0.5) != 0, "subnormals flushed after the kt peer"
    if importlib.util.find_spec("kt_kernel") is None:
        assert rows == [] and "pip install kt-kernel==0.7.2 --no-deps" in out
        return
    info = kt_peer.probe()  # kt's module for this CPU, run in a subprocess (a SIGILL lands there)
    if isinstance(info, str):
        assert rows == [] and "no usable module" in out
        return
    assert info["ran"] and f"CPUInfer({threads})" in out and "CPUInfer(1)" in out
    check_kt_rows(rows, threads, info["ran"], (1, 3))


def test_kt_peer_reports_a_module_this_cpu_cannot_run(monkeypatch, capsys):
    """kt's AMX module forced on a CPU without AMX dies of SIGILL in the probe's subprocess, not here."""
    monkeypatch.setenv("KT_KERNEL_CPU_VARIANT", "amx")  # kt's own override of its CPU detection
    rows = kt_peer.kt_peer(np.random.default_rng(0), 1, ms=(1,), schemes=("bf16",), experts=8, min_time=0.02)
    out = capsys.readouterr().out
    if importlib.util.find_spec("kt_kernel") is None:
        assert rows == [] and "pip install kt-kernel==0.7.2 --no-deps" in out
    elif "amx" in moe_cpu.cpu_features()["detected"]:
        check_kt_rows(rows, 1, ("bf16",), (1,))
    else:
        assert rows == [] and "no usable module for this CPU: running AMXInt8_MOE of _kt_kernel_ext_amx died of SIGILL" in out


def test_bench_decode_hot_and_cold_beside_the_bandwidth(tmp_path):
    """--decode: one row per form, each with the read probe, cold and hot GB/s of the same rounds, and their ratios."""
    forms = ("int4_w4a8", "q4_k", "q5_k", "bf16")
    out = run_cli(tmp_path, "bench", "--decode", "--experts", "16", "--rounds", "2", "--schemes", ",".join(forms),
                  "--out", str(tmp_path / "d"))
    data = json.loads((tmp_path / "d" / "bench_decode.json").read_text())
    assert "decode hot / cold" in out and "cold/min" in out
    assert [r["form"] for r in data["rows"]] == list(forms)
    kernels = moe_cpu.cpu_features()["kernels"]
    for r in data["rows"]:
        assert r["kernel"] == kernels[random_forms.scheme_of(r["form"])]
        assert len(r["rounds"]["bw"]) == len(r["rounds"]["cold"]) == len(r["rounds"]["hot"]) == 2
        assert r["bw_gbs"] > 0 and r["cold_gbs"] > 0 and r["hot_gbs"] > 0 and r["mb_per_call"] > 0
        cold_min = [c / min(h, b) for c, h, b in zip(r["rounds"]["cold"], r["rounds"]["hot"], r["rounds"]["bw"])]
        assert min(cold_min) <= r["cold_min"] <= max(cold_min)
        assert f"{r['form']:11} {r['kernel']:18}" in out


def test_random_forms_pack_as_the_gguf_loader_does():
    """The bench's GGUF forms hold what the loader makes of the files: fp16 scales (Q4_0, Q8_0), integer scales and
    mins (K-quants), 5- and 6-bit codes (Q5_K, Q6_K), activation blocks of 32 (128 for the K-quants); int4_pc one
    scale per channel."""
    rng = np.random.default_rng(0)
    make = lambda f: random_forms.random_codes(rng, f, 2, 32, 256, gguf_blocks=True)()
    for f in ("q4_0", "q8_0"):   # fp16 scales where the kernel takes them: the x86 int kernels but AMX's
        p = make(f)
        assert p.has_half_scales == ("_amx" not in p.kernel) and p.act_block == 32, (f, p.kernel)
    for f in ("q4_k", "q5_k", "q6_k", "iq4_xs"):   # integer scales where the kernel takes them: not AMX's int8 tiles
        p = make(f)
        assert p.has_int_scales == (not p.kernel.startswith("w8a8_amx")), (f, p.kernel)
        assert p.act_block == (32 if f == "iq4_xs" else 128), f
    assert make("q4_k").has_int_mins and make("q5_k").has_mins
    if moe_cpu.cpu_features()["kernels"]["int8_w8a8"].startswith("w8a8_avx2"):   # split codes: the AVX2 int8 kernel
        assert make("q5_k").code_bits == 5 and make("q6_k").code_bits == 6
    assert make("int4_pc").group_size == -1 and make("int4_w4a8").act_block is None
    assert random_forms.random_codes(rng, "q4_k", 2, 32, 256)().act_block is None   # moe-cpu bench's rows: per token


@pytest.mark.parametrize("args,says", [
    (["--experts", "12"], "--decode needs at least 2k = 16 experts"),
    (["--experts", "-1"], "--experts -1 must be >= 0"),
])
def test_bench_decode_refuses_a_plan_before_measuring(tmp_path, capsys, args, says):
    assert cli.main(["bench", "--decode", "--schemes", "bf16", "--out", str(tmp_path / "x"), *args]) == 2
    out = capsys.readouterr()
    assert says in out.err and "decode hot / cold" not in out.out


@pytest.mark.parametrize("args", [["--m", "1"], ["--quick"], ["--rounds", "0"], ["--rounds", "x"]])
def test_bench_decode_bad_arguments_exit_2(args):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--decode", *args])
    assert e.value.code == 2
