"""Dispatch: the ISA forced with MOE_CPU_ISA (CI runs the whole suite once per level) is the path the
packed weights really take, force_isa() works, and cpu_features() reports it."""
import os
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import moe_cpu
from moe_cpu.bench.peaks import kernel_isa

pytestmark = pytest.mark.isa   # kernel results: run at every ISA level (scripts/test.sh)

LEVEL = os.environ.get("MOE_CPU_ISA", "native")
DETECTED = set(moe_cpu.cpu_features()["detected"])
# ISA words a level allows (the registry tries kernels best first among these).
ALLOWED = {
    "reference": {"reference"},
    "avx2": {"avx2", "reference"},
    "avx2vnni": {"avx2vnni", "avx2", "reference"},
    "avx512": {"avx512vnni", "avx512vbmi", "avx512bf16", "avx2", "avx2vnni", "reference"},
    "avx512_novbmi": {"avx512vnni", "avx512bf16", "avx2", "avx2vnni", "reference"},
    "amx": {"amx", "avx512vnni", "avx512vbmi", "avx512bf16", "avx2", "avx2vnni", "reference"},
    "amx_model": {"amx_model"},
}


def _packed(scheme):
    w = np.random.default_rng(0).standard_normal((2, 64, 128)).astype(np.float32)
    return moe_cpu.quantize_experts(w, scheme)


# The A16 schemes' kernels: AMX (the int8 tiles, two dot products per step), AVX-512 VNNI and AVX2 (vpmaddwd) on
# x86 (amx_model: the AMX code on the tile model), one AdvSIMD kernel (SMLAL) on every Arm level.
A16_ISA = {"native": "avx512vnni", "avx512": "avx512vnni", "avx512_novbmi": "avx512vnni", "amx": "avx512vnni",
           "avx2": "avx2", "avx2vnni": "avx2", "amx_model": "amx_model", "reference": "reference"}


@pytest.mark.parametrize("scheme", moe_cpu.A16_SCHEMES)
def test_a16_level_is_the_path_taken(scheme):
    isa = kernel_isa(_packed(scheme).kernel)
    if platform.machine() in ("aarch64", "arm64"):
        want = "reference" if LEVEL == "reference" else "neon"
    elif LEVEL in ("native", "amx") and "amx" in DETECTED:
        want = "amx"
    else:
        want = A16_ISA.get(LEVEL, "reference")
    if want == "avx512vnni" and "avx512_vnni" not in DETECTED:
        want = "avx2" if "avx2" in DETECTED else "reference"
    if want == "avx2" and "avx2" not in DETECTED:
        want = "reference"
    assert isa == want, f"MOE_CPU_ISA={LEVEL}: {scheme} runs {isa}"


@pytest.mark.parametrize("scheme", [s for s in moe_cpu.SCHEMES if s not in moe_cpu.A16_SCHEMES])
def test_forced_level_is_the_path_taken(scheme):
    isa = kernel_isa(_packed(scheme).kernel)
    assert moe_cpu.cpu_features()["isa"] == LEVEL
    if LEVEL in ALLOWED:
        assert isa in ALLOWED[LEVEL], f"MOE_CPU_ISA={LEVEL} but {scheme} runs {isa}"
    # The best path the level admits on this CPU is the one taken (never a silent fallback).
    int_scheme = scheme in ("int4_w4a8", "int8_w8a8")
    if LEVEL in ("native", "amx") and "amx" in DETECTED:
        assert isa == "amx"   # the tiles for experts with many rows, their AVX-512 twins for the rest
    elif LEVEL in ("native", "avx512", "avx512_novbmi") and "avx512" in DETECTED:
        want = "avx512vnni" if int_scheme else "avx512bf16"
        if scheme == "fp8_w8a16" and LEVEL != "avx512_novbmi" and "avx512_vbmi" in DETECTED:
            want = "avx512vbmi"
        if (want == "avx512vnni" and "avx512_vnni" in DETECTED) or (want != "avx512vnni" and "avx512_bf16" in DETECTED):
            assert isa == want
    if LEVEL == "avx2" and "avx2" in DETECTED:
        assert isa == "avx2"   # the avx2 level masks AVX-VNNI: vpmaddubsw / FMA kernels
    if LEVEL == "avx2vnni" and "avx_vnni" in DETECTED:
        assert isa == ("avx2vnni" if int_scheme else "avx2")
    if LEVEL == "reference":
        assert isa == "reference"
    if LEVEL == "amx_model":
        assert isa == "amx_model"   # the AMX code on the scalar tile model, for every scheme


def test_amx_levels_and_status():
    f = moe_cpu.cpu_features()
    assert f["amx_min_rows"] >= 1
    assert f["amx_min_rows_float"] == (f["amx_min_rows"] if f["amx_min_rows_set"] else 8)
    # "emulated: ..." where tests/amx_trap's SIGILL handler is preloaded (scripts/test.sh, CPUs without AMX)
    assert ("amx" in DETECTED) == (f["amx"] == "granted" or f["amx"].startswith("emulated: ")), f["amx"]
    if platform.machine() in ("x86_64", "AMD64"):
        assert "amx_model" in DETECTED and ("amx_model" in f["active"]) == (LEVEL == "amx_model")
    if LEVEL in ("avx512", "avx512_novbmi"):
        assert "amx" not in f["active"]
    if "amx" not in DETECTED:
        with pytest.raises(ValueError, match="AMX: "):
            moe_cpu.force_isa("amx")


def test_set_amx_min_rows_checks_and_restores():
    f0 = moe_cpu.cpu_features()
    before = f0["amx_min_rows"] if f0["amx_min_rows_set"] else None
    try:
        moe_cpu.set_amx_min_rows(7)
        f = moe_cpu.cpu_features()
        assert moe_cpu.get_amx_min_rows() == 7 and f["amx_min_rows"] == 7 and f["amx_min_rows_float"] == 7
        with pytest.raises(ValueError, match="must be >= 1"):
            moe_cpu.set_amx_min_rows(0)
        with pytest.raises(TypeError, match="rows must be an int"):
            moe_cpu.set_amx_min_rows(2.5)
        assert moe_cpu.get_amx_min_rows() == 7
        moe_cpu.set_amx_min_rows(None)   # back to the variable or, without it, the defaults
        f, env = moe_cpu.cpu_features(), os.environ.get("MOE_CPU_AMX_MIN_ROWS")
        assert f["amx_min_rows_set"] == bool(env), f
        assert (f["amx_min_rows"], f["amx_min_rows_float"]) == ((int(env),) * 2 if env else (16, 8)), f
    finally:
        moe_cpu.set_amx_min_rows(before)


@pytest.mark.parametrize("value, want", [("1", "1"), ("4096", "4096"), ("0", "not a positive integer"),
                                         ("-3", "not a positive integer"), ("12x", "not a positive integer")])
def test_amx_min_rows_from_the_environment(tmp_path, value, want):
    code = "import moe_cpu\nprint(moe_cpu.cpu_features()['amx_min_rows'])\n"
    env = dict(os.environ, MOE_CPU_AMX_MIN_ROWS=value)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    if want.isdigit():
        assert out.returncode == 0 and out.stdout.strip() == want, out.stderr
    else:
        assert out.returncode != 0 and "ValueError: MOE_CPU_AMX_MIN_ROWS" in out.stderr and want in out.stderr


def test_force_isa_changes_later_packing_only(tmp_path):
    code = (
        "import numpy as np, moe_cpu as mc\n"
        "w = np.ones((1, 32, 64), np.float32)\n"
        "before = mc.quantize_experts(w, 'int8_w8a8')\n"
        "mc.force_isa('reference')\n"
        "after = mc.quantize_experts(w, 'int8_w8a8')\n"
        "print(before.kernel, after.kernel, mc.cpu_features()['isa'])\n"
    )
    env = dict(os.environ)
    env.pop("MOE_CPU_ISA", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, check=True)
    before, after, isa = out.stdout.split()
    assert after == "w8a8_reference" and isa == "reference"
    assert before == moe_cpu._core.selected_kernel("int8_w8a8") or LEVEL != "native"


def test_every_registered_kernel_is_named_by_the_grammar():
    for k in moe_cpu._core.registered_kernels():
        prefix = {"int4_w4a8": "w4a8", "int8_w8a8": "w8a8", "fp8_w8a16": "fp8w", "bf16": "bf16", "int4_w4a16": "w4a16",
                  "int8_w8a16": "w8a16"}[k["scheme"]]
        want = f"{prefix}_{k['isa']}" + ("" if k["isa"] == "reference" else f"_{k['mr']}x{k['nr']}")
        assert k["name"] == want


def test_avx2vnni_level_needs_avx_vnni(tmp_path):
    code = "import moe_cpu as mc\nmc.force_isa('avx2vnni')\nprint(mc.quantize_experts(__import__('numpy').ones((1, 32, 128), 'float32'), 'int4_w4a8').kernel)\n"
    env = dict(os.environ)
    env.pop("MOE_CPU_ISA", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    if "avx_vnni" in DETECTED:
        assert out.returncode == 0 and out.stdout.strip() == "w4a8_avx2vnni_4x16", out.stderr
    else:
        assert out.returncode != 0 and "needs CPU features this machine lacks" in out.stderr


EVEX_ONLY = re.compile(r"%zmm|%ymm(1[6-9]|2[0-9]|3[01])\b|%xmm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]\b|\{1to")


@pytest.mark.slow  # a subprocess: the full run, not `test.sh quick`
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 encoding check")
def test_shipped_avx2vnni_kernels_are_vex_only():
    """The AVX-VNNI kernels must run on CPUs without AVX-512: their code is {vex} vpdpbusd and
    nothing EVEX-only (zmm, ymm16-31, mask registers, embedded broadcasts)."""
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is needed for this check"
    asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", moe_cpu._core.__file__],
                         capture_output=True, text=True, check=True).stdout
    # The module is stripped to its dynamic symbols; each function ends at its symbol's size.
    sizes = {}
    for ln in subprocess.run(["nm", "-D", "-S", moe_cpu._core.__file__], capture_output=True, text=True,
                             check=True).stdout.splitlines():
        parts = ln.split()
        if len(parts) >= 4:
            sizes[int(parts[0], 16)] = int(parts[1], 16)
    funcs = []
    for f in re.split(r"\n(?=[0-9a-f]+ <)", asm):
        head = f.splitlines()[0]
        if not re.search(r"\(moe_cpu::kernels::(?:\w+::)?IntDot\)1[,>]", head) or "@plt>" in head:
            continue
        start = int(head.split()[0], 16)
        end = start + sizes[start]
        body = [ln for ln in f.splitlines()[1:] if re.match(r"\s*([0-9a-f]+):", ln)
                and int(re.match(r"\s*([0-9a-f]+):", ln).group(1), 16) < end]
        funcs.append("\n".join([head] + body))
    runs = [f for f in funcs if "::run(" in f.splitlines()[0]]
    assert len(runs) >= 4, "expected the w4a8 / w8a8 avx2vnni microkernels in _core"
    for f in runs:
        assert "{vex} vpdpbusd" in f, f.splitlines()[0]
    for f in funcs:
        bad = [ln for ln in f.splitlines()[1:] if EVEX_ONLY.search(ln)]
        assert not bad, f"{f.splitlines()[0]}: EVEX-only instructions {bad[:3]}"


TILE_COUNT = r"""
import ctypes, json, numpy as np, moe_cpu
count = ctypes.CDLL(None).moe_cpu_amx_trap_count
count.restype = ctypes.c_uint64
rng = np.random.default_rng(0)
E, k, H, I = 4, 2, 128, 128

def tiles(scheme, g, M, ab=None):   # tile instructions one call runs; M // 2 rows per expert
    q = dict(group_size=g) if ab is None else dict(group_size=g, act_block=ab)
    w13 = moe_cpu.quantize_experts(rng.standard_normal((E, 2 * I, H), dtype=np.float32), scheme, **q)
    w2 = moe_cpu.quantize_experts(rng.standard_normal((E, H, I), dtype=np.float32), scheme, **q)
    x = rng.standard_normal((M, H), dtype=np.float32)
    ids = ((np.arange(M)[:, None] * k + np.arange(k)[None, :]) % E).astype(np.int32)
    c0 = count()
    moe_cpu.fused_experts(x, w13, w2, np.full((M, k), 0.5, np.float32), ids)
    return count() - c0

cases = [("int4_w4a8", 128, 64), ("int4_w4a8", 32, 64), ("int4_w4a16", 128, 64), ("int8_w8a8", -1, 64),
         ("int8_w8a8", -1, 16), ("bf16", None, 16), ("fp8_w8a16", None, 16), ("bf16", None, 8),
         ("int8_w8a8", 32, 64, 32)]
out = {"amx": moe_cpu.cpu_features()["amx"], "set0": moe_cpu.cpu_features()["amx_min_rows_set"]}
out["default"] = [tiles(*c) for c in cases]
moe_cpu.set_amx_min_rows(moe_cpu.get_amx_min_rows())
out["set"] = [tiles(*c) for c in cases]
moe_cpu.set_amx_min_rows(1)
out["one"] = [tiles(*c) for c in cases]
print(json.dumps(out))
"""


def test_forms_whose_tiles_lose_stay_on_avx512_unless_every_expert_is_sent():
    """Default thresholds (16 rows; bf16 and fp8: 8): int4 g128 and int8 per channel with 32 rows per expert
    take the tiles, and bf16 and fp8 with 8; int4 and int8 in groups of 32 (GGUF's Q4_0 / Q8_0 forms, with
    activation blocks of 32), A16, 8-row int8 and 4-row bf16 experts do not. A set 16 applies to bf16 and fp8
    too (8 rows: no tiles) and still leaves the losing forms on AVX-512; a set 1 sends every expert of every
    form to the tiles. Counted by the tests' SIGILL trap, which runs each tile instruction (a fresh process
    with the trap preloaded and no MOE_CPU_AMX_MIN_ROWS; on AMX CPUs, each tile-data instruction)."""
    import json
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    trap = os.path.join(root, "build", "py", "libmoe_cpu_amx_trap.so")
    assert os.path.exists(trap), "the trap library is built with the C++ tests (scripts/setup.sh builds them in build/py)"
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_CPU_AMX_MIN_ROWS", "MOE_CPU_ISA", "LD_PRELOAD")}
    env["LD_PRELOAD"] = trap
    r = subprocess.run([sys.executable, "-c", TILE_COUNT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not out["amx"].startswith("emulated"):
        pytest.skip(f"no AMX kernels here: {out['amx']}")
    assert out["set0"] is False
    g128, g32, a16, i8, i8_small, bf, fp8, bf_small, i8_g32 = out["default"]
    assert g128 > 0 and i8 > 0 and bf > 0 and fp8 > 0, out
    assert g32 == 0 and a16 == 0 and i8_small == 0 and bf_small == 0 and i8_g32 == 0, out
    s128, s32, sa16, si8, si8_small, sbf, sfp8, sbf_small, si8_g32 = out["set"]
    assert s128 > 0 and si8 > 0, out
    assert s32 == 0 and sa16 == 0 and si8_g32 == 0 and si8_small == 0 and sbf == 0 and sfp8 == 0 and sbf_small == 0, out
    assert min(out["one"]) > 0, out
