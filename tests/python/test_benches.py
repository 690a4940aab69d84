"""bench/ and bench/studies/ still run: each script answers --help with its docstring's first line, runs a tiny
configuration to completion (or, where this host lacks what it needs: AMX, a GPU, llvm-mca 16+, ik_llama.cpp,
MPI, refuses in one line), and refuses bad arguments in one line, never with a traceback (bench/README.md).
test_team.py's test_benches_refuse_bad_counts holds the bad counts of contention / scaling / team_ab / builds_ab.
All slow: subprocesses, not in `scripts/test.sh quick`."""
import ast
import glob
import importlib.util
import os
import platform
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
SCRIPTS = sorted(os.path.relpath(p, BENCH) for p in glob.glob(os.path.join(BENCH, "*.py"))
                 + glob.glob(os.path.join(BENCH, "studies", "*.py")))
ALL = SCRIPTS + ["ep_scaling.sh"]
IK_DIR = "/tmp/ikpeer"            # bench/ik_peer.py's default --ik-dir
IK_FILES = "/tmp/ik_peer_models"  # and its default --work-dir
pytestmark = pytest.mark.slow


def first_line(script):
    path = os.path.join(BENCH, script)
    if script.endswith(".sh"):   # the comment under the shebang
        return open(path).read().splitlines()[1].lstrip("# ")
    return ast.get_docstring(ast.parse(open(path).read())).splitlines()[0]


def run(script, args, cwd, env=None, timeout=180):
    """The script in a subprocess, from cwd (not the source tree: a `-c` child would import its moe_cpu)."""
    cmd = ["bash"] if script.endswith(".sh") else [sys.executable]
    e = {k: v for k, v in os.environ.items() if k not in ("MOE_CPU_TEAM", "MOE_CPU_SPIN_US")}
    e.update(env or {})
    return subprocess.run(cmd + [os.path.join(BENCH, script), *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)


def has(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:
        return False


def amx():
    import moe_cpu

    return "amx" in moe_cpu.cpu_features()["active"]


def site():
    """The directory that holds the installed moe_cpu package (builds_ab.py's --old / --new)."""
    import moe_cpu

    return os.path.dirname(os.path.dirname(os.path.abspath(moe_cpu.__file__)))


def cuda():
    if not has("torch"):
        return "needs torch"
    if not os.path.exists("/dev/nvidiactl"):
        return "needs a CUDA GPU"
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True,
                       text=True, timeout=120)
    return None if p.stdout.strip() == "True" else "needs a CUDA GPU"


def ik_peer_needs():
    if not has("gguf"):
        return "needs gguf-py"
    return None if os.path.isfile(os.path.join(IK_DIR, "ik_llama_cpp", "__init__.py")) else "no ik_llama.cpp peer"


def layers_needs():
    if not amx():
        return "needs AMX tiles"
    return None if os.path.isfile(os.path.join(IK_FILES, "q_H2048_E128_I768_k8_s0_f16_Q4_0.gguf")) else \
        "run bench/ik_peer.py --prepare-only"


def kernel():
    return "w4a8_neon_dotprod" if platform.machine() in ("aarch64", "arm64") else "w4a8_avx2"


def inner_loop_needs():
    build = os.path.join(ROOT, "build", "py")
    if not os.path.isdir(build):
        return "no build directory"
    if not glob.glob(os.path.join(build, "**", f"{kernel()}.cpp.o"), recursive=True):
        return "no kernel object files"
    return None if shutil.which("objdump") else "needs objdump"


def mca():
    """llvm-mca to use: a 16+ one found by the script (None), plain llvm-mca (LLVM 14 knows znver3), or none ('')."""
    if any(shutil.which(f"llvm-mca-{v}") for v in range(16, 23)):
        return None
    return "llvm-mca" if shutil.which("llvm-mca") else ""


def tile_mca_needs():
    for tool in ("g++", "objdump", "c++filt"):
        if not shutil.which(tool):
            return f"needs {tool}"
    if mca() == "":
        return "no llvm-mca 16 or later"
    return None if platform.machine() in ("x86_64", "AMD64") else "could not compile"   # x86 AVX2 code


def mpi_needs():
    if not shutil.which("mpirun"):
        return "needs Open MPI's mpirun"
    return None if has("mpi4py") else "needs mpi4py"


def no_needs():
    return None


def own_bits_needs():
    if not shutil.which("g++"):
        return "needs g++"
    if not has("gguf"):
        return "needs gguf-py"
    import moe_cpu
    return None if "avx2" in moe_cpu.cpu_features()["detected"] else "needs an AVX2 host"


# script -> (tiny arguments with {tmp} for a scratch directory, what its output shows, what it lacks here or None)
TINY = {
    "a16_vs_a8.py": ("--weights int4 --m 1 --rounds 1 --experts 8 --bw-bytes 67108864", "A16/A8", no_needs),
    "bench_moe.py": ("--shapes qwen3-30b-a3b --experts 8 --m 1 --schemes int8_w8a8 --no-peers --out {tmp}", "wrote",
                     no_needs),
    "bench_transformers_patch.py": ("--experts 8 --m 1 --rounds-decode 1 --schemes bf16", "moe_cpu bf16",
                                    lambda: None if has("torch") and has("transformers")
                                    else "needs torch and transformers"),
    "builds_ab.py": ("--old {site} --new {site} --cases int8_w8a8 --experts 8 --rounds 1", "new/old", no_needs),
    "contention.py": ("--m 1 --neighbours 0 --calls 3 --experts 8", "moe_cpu", no_needs),
    "ik_peer.py": ("--small --types Q4_0 --m 1 --reps 1 --warmup 1 --no-bw --ik-configs rtr=0,fmoe=1 --no-install "
                   "--work-dir {tmp}", "summary", ik_peer_needs),
    "scaling.py": ("--threads 1 --m 1 --reps 2 --experts 8 --bw-bytes 67108864", "tok/s", no_needs),
    "stream_cuda_host.py": ("--steps 4 --threads 2 --experts 8", "PASS", cuda),
    "stream_overlap.py": ("--schemes int4_w4a8 --rounds 1 --layers 1 --experts 8 --idle-s 0.1 --tokens 2",
                          "decode loop", no_needs),
    "team_ab.py": ("--rounds 1 --m 1 --experts 8 --calls 5", "moe_cpu / omp", no_needs),
    "studies/act_blocks_ab.py": ("--forms q4_0 --m 1 --reps 1 --experts 8", "q4_0", no_needs),
    "studies/act_order_overhead.py": ("--shape small --m 1 --reps 1", "w13+w2", no_needs),
    "studies/amx_float_threshold.py": ("--m 64 --rounds 1 --experts 8 --schemes bf16", "old/new",
                                       lambda: None if amx() else "needs AMX tiles"),
    "studies/amx_g32_forms.py": ("--rows 16 --forms int8_g32 --experts 8 --seconds 0.05", "tiles",
                                 lambda: None if amx() else "needs AMX tiles"),
    "studies/amx_g32_layers.py": (f"1 Q4_0 --m 128 --rounds 1 --work-dir {IK_FILES}", "set/default", layers_needs),
    "studies/ep_model.py": ("--trials 100", "| 8 |", no_needs),
    "studies/gguf_forms_ab.py": ("--m 1 --reps 1 --forms q4_k --experts 8", "speed vs", no_needs),
    "studies/own_bits_decode.py": ("--experts 8 --rounds 1 --calls 2", "own / moe_cpu", own_bits_needs),
    "studies/router_gate_bf16_ab.py": ("--experts 8 --layers 2 --rounds 1 --calls 2", "bf16 gates / float32 gates", no_needs),
    "studies/inner_loop_mix.py": ("--kernels {kernel}", "dot/FMA", inner_loop_needs),
    "studies/tile_mca.py": ("--cpus znver3 --iterations 10 {mca}", "moe_cpu runs (256-blocks)", tile_mca_needs),
    "ep_scaling.sh": ("--shapes qwen3-30b-a3b --experts 8 --m 1 --calls 1 --sweep=", "wrote", mpi_needs),
}


def assert_one_line_refusal(out, needle):
    """A non-zero exit whose stderr is one line with `needle` (after argparse's usage lines, if any)."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines and needle in lines[-1], out.stderr[-3000:]
    assert all(ln.startswith(("usage:", " ")) for ln in lines[:-1]), out.stderr[-3000:]


def test_every_script_has_a_tiny_run():
    assert sorted(TINY) == sorted(ALL), "a bench without a tiny configuration in TINY"


@pytest.mark.parametrize("script", ALL)
def test_help_prints_what_it_measures(script, tmp_path):
    out = run(script, ["--help"], tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert first_line(script) in out.stdout, out.stdout[:2000]


@pytest.mark.parametrize("script", ALL)
def test_runs_tiny_or_refuses_in_one_line(script, tmp_path):
    args, shows, needs = TINY[script]
    args = args.format(tmp=tmp_path, kernel=kernel(), site=site() if "{site}" in args else "",
                       mca="" if "{mca}" not in args or not mca() else f"--mca {mca()}").split()
    env = {"RANKS": "1 2", "LOG": str(tmp_path / "ep.log"), "OUT": str(tmp_path)} if script.endswith(".sh") else {}
    lacks = needs()
    out = run(script, args, tmp_path, env)
    if lacks is None:
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
        assert shows in out.stdout, out.stdout[-3000:]
    else:
        assert_one_line_refusal(out, lacks)


@pytest.mark.parametrize("script,args,needle", [
    ("ik_peer.py", ["--types", "Q4_0,Q9_9"], "--types: unknown 'Q9_9'"),
    ("ik_peer.py", ["--m", "0"], "batch sizes must be >= 1"),
    ("ik_peer.py", ["--m", "1,-4"], "batch sizes must be >= 1"),
    ("ik_peer.py", ["--m", "1.5"], "expected comma-separated batch sizes"),
    ("ik_peer.py", ["--ik-lib", "/nonexistent/libllama.so"], "--ik-lib '/nonexistent/libllama.so' is not a file"),
    ("ik_peer.py", ["--ik-configs", "rtr=1,speed=9"], "unknown option(s) ['speed']"),
    ("ik_peer.py", ["--no-install", "--ik-dir", "/nonexistent"], "no ik_llama.cpp peer in /nonexistent"),
    ("ik_peer.py", ["--block", "deepseek-v3", "--experts", "36"], "--experts 36: needs at least top-k 8 experts in "
                                                                    "whole groups of 8"),
    ("ik_peer.py", ["--block", "llama"], "argument --block: invalid choice: 'llama'"),
    ("a16_vs_a8.py", ["--m", "0"], "token counts must be >= 1"),
    ("a16_vs_a8.py", ["--m", "1,x"], "expected comma-separated token counts"),
    ("a16_vs_a8.py", ["--weights", "int3"], "--weights: unknown 'int3'"),
    ("a16_vs_a8.py", ["--experts", "4"], "must be >= the top-k of 8"),
    ("stream_overlap.py", ["--schemes", "int4_w4a8,int3"], "--schemes: unknown 'int3'"),
    ("stream_overlap.py", ["--rounds", "0"], "must be >= 1"),
    ("stream_overlap.py", ["--experts", "-8"], "must be >= the top-k of 8"),
    ("scaling.py", ["--m", "0"], "token counts must be >= 1"),
    ("scaling.py", ["--m", "1.5"], "--m integers"),
    ("scaling.py", ["--scheme", "int3"], "invalid choice: 'int3'"),
    ("bench_moe.py", ["--m", "0"], "token counts must be >= 1"),
    ("bench_moe.py", ["--m", "x"], "expected token counts"),
    ("bench_moe.py", ["--schemes", "int3"], "unknown ['int3']"),
    ("bench_transformers_patch.py", ["--m", "-1"], "token counts must be >= 1"),
    ("bench_transformers_patch.py", ["--schemes", "int3"], "--schemes: unknown 'int3'"),
    ("team_ab.py", ["--m", "one"], "expected comma-separated token counts"),
    ("team_ab.py", ["--extra-env", "GOMP_SPINCOUNT"], "--extra-env takes VAR=VALUE"),
    ("studies/act_blocks_ab.py", ["--forms", "q9_k"], "--forms: unknown 'q9_k'"),
    ("studies/gguf_forms_ab.py", ["--m", "0"], "the token count must be >= 1"),
    ("studies/act_order_overhead.py", ["--group", "100"], "--group 100 must divide"),
    ("studies/inner_loop_mix.py", ["/nonexistent"], "no build directory /nonexistent"),
    ("studies/tile_mca.py", ["--iterations", "0"], "--iterations must be >= 1"),
    ("studies/own_bits_decode.py", ["--experts", "4"], "--experts must be >= 8"),
    ("studies/router_gate_bf16_ab.py", ["--form", "q9_k"], "--form 'q9_k': one of"),
])
def test_benches_refuse_bad_arguments_in_one_line(script, args, needle, tmp_path):
    assert_one_line_refusal(run(script, args, tmp_path), needle)


def test_builds_ab_refuses_an_unknown_case(tmp_path):
    out = run("builds_ab.py", ["--old", site(), "--new", site(), "--cases", "int4_w4a8,Q9_9", "--work-dir",
                               str(tmp_path)], tmp_path)
    assert_one_line_refusal(out, "--cases Q9_9: neither a scheme / form")


def test_builds_ab_times_whole_layers_of_gguf_files(tmp_path):
    """--layer: each worker times a GGUF file's MoELayer call (router included); random blocks have no router."""
    from test_gguf_quants import moe_file
    import numpy as np
    path, _ = moe_file(tmp_path, np.random.default_rng(0), ("Q4_0",) * 3, E=8)
    os.rename(path, tmp_path / "q_H2048_E128_I768_k8_s0_f16_Q4_0.gguf")   # the name of ik_peer.py's cache
    out = run("builds_ab.py", ["--old", site(), "--new", site(), "--cases", "Q4_0", "--layer", "--rounds", "2",
                               "--work-dir", str(tmp_path)], tmp_path)
    assert out.returncode == 0 and "whole layer" in out.stdout and "Q4_0       new/old" in out.stdout, out.stderr
    out = run("builds_ab.py", ["--old", site(), "--new", site(), "--cases", "int8_w8a8", "--layer"], tmp_path)
    assert_one_line_refusal(out, "--cases int8_w8a8 is a random block without a router")


@pytest.mark.skipif(has("kt_kernel"), reason="kt-kernel is installed here")
def test_stream_overlap_refuses_a_missing_kt_peer(tmp_path):
    assert_one_line_refusal(run("stream_overlap.py", ["--kt-peer"], tmp_path), "kt-kernel is not installed")


@pytest.mark.skipif(os.path.isdir(os.path.join(IK_DIR, "ik_llama_cpp")), reason="the ik wheel is installed here")
def test_contention_refuses_a_missing_ik_peer(tmp_path):
    assert_one_line_refusal(run("contention.py", ["--ik"], tmp_path), "--ik: no ik_llama.cpp wheel")


def test_ep_scaling_refuses_bad_rank_counts(tmp_path):
    out = run("ep_scaling.sh", [], tmp_path, {"RANKS": "1 two", "LOG": str(tmp_path / "log")})
    assert_one_line_refusal(out, mpi_needs() or "RANKS='1 two' must hold rank counts >= 1")


def test_ik_peer_deepseek_block_routes_grouped_with_a_shared_expert(tmp_path):
    """The DeepSeek-V3-shaped block (deepseek2 file: MLA attention, grouped sigmoid routing, a shared expert) runs
    on both engines, and moe_cpu's layer error against the float64 reference of the dequantized file (routed
    experts plus the shared one) is a quantization error, not a routing or shared-expert mistake."""
    out = run("ik_peer.py", ["--small", "--block", "deepseek-v3", "--types", "Q8_0", "--m", "1,8", "--reps", "1",
                             "--warmup", "1", "--no-bw", "--ik-configs", "rtr=0,fmoe=1", "--no-install",
                             "--work-dir", str(tmp_path)], tmp_path, timeout=600)
    lacks = ik_peer_needs()
    if lacks:   # (as every tiny run: no peer here, a one-line refusal)
        return assert_one_line_refusal(out, lacks)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "shared expert Q8_0/Q8_0/Q8_0" in out.stdout, out.stdout[-3000:]
    assert ("routing: moe_cpu grouped sigmoid top-4, 4 of 8 groups, correction bias, renormalized, scale 2.5; "
            "ik plain top-k") in out.stdout, out.stdout[-3000:]
    rows = [ln.split("|") for ln in out.stdout.splitlines() if ln.strip().startswith(("1 |", "8 |"))]
    assert len(rows) == 2, out.stdout[-3000:]
    for r in rows:   # columns: M, ik ms, moe_cpu ms, ratio, mc exp ms, ik GB/s, mc GB/s, ik err, mc err, ...
        ik_err, mc_err = float(r[7]), float(r[8])
        # Q8_0 weights and 8-bit activations: both about 1.2e-2; a wrong expert, weight or shared expert is O(1)
        assert 0 < mc_err < 3e-2 and 0 < ik_err < 3e-2, r


def test_ik_peer_types_are_the_loaders():
    # ik_peer.py refuses a --types entry outside TYPES: the GGUF types moe_cpu's loader reads
    from moe_cpu.loaders.gguf_loader import _FLOAT, _QUANT

    tree = ast.parse(open(os.path.join(BENCH, "ik_peer.py")).read())
    types = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["TYPES"])
    assert set(types) == set(_QUANT) | set(_FLOAT)
