"""scripts/isa_audit.py catches ISA code that the linker could hand to portable code (cpp/src/kernels/README.md, "ISA regions").

The build's own objects are audited by ctest (isa_audit) and by scripts/test.sh's emulated stage; here the audit
meets small files built for the purpose: the leak it was written for (a shared inline helper and std::vector's
growth in a file compiled with ISA flags, as amx_scratch.h's tile_config was), a helper given an ISA by a
target attribute, and the same code in an ISA region, which must pass.
"""
import os
import platform
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "isa_audit")
AUDIT = os.path.join(ROOT, "scripts", "isa_audit.py")

pytestmark = [
    pytest.mark.slow,  # compiles C++ files: the full run, not `test.sh quick`
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the fixtures are x86 code"),
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("objdump") is None, reason="needs g++ and binutils"),
]


def compile_(tmp_path, src, opt, *flags):
    out = tmp_path / ("%s_%s.o" % (src[:-4], opt.lstrip("-")))
    subprocess.run(["g++", "-std=c++17", opt, "-frecord-gcc-switches", "-c", os.path.join(FIXTURES, src),
                    "-I", os.path.join(ROOT, "cpp", "src"), "-o", str(out), *flags], check=True)
    return str(out)


def audit(*objs):
    return subprocess.run([sys.executable, AUDIT, *objs], capture_output=True, text=True)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_a_flagged_file_sharing_an_inline_helper_fails(tmp_path, opt):
    r = audit(compile_(tmp_path, "portable.cpp", opt), compile_(tmp_path, "flagged.cpp", opt, "-mavx512f"))
    assert r.returncode == 1, r.stdout + r.stderr
    leaks = [l for l in r.stdout.splitlines() if l.startswith("LEAK")]
    # every external symbol of the flagged file is named, the helper (where not inlined) and std::vector's growth
    assert any("flagged_O" in l and "_M_default_append" in l and "compiled with -mavx512f" in l for l in leaks), leaks
    assert not any("portable_O" in l for l in leaks), leaks
    if opt == "-O0":  # nothing inlined: the flagged copy of the helper is AVX-512 code, as tile_config was
        assert any("flagged_O0" in l and "make_config(float)" in l and "above-baseline code" in l for l in leaks), leaks
        assert any("flagged_O0" in l and "make_config(float)" in l and "compiled with" in l for l in leaks), leaks


def test_a_target_attribute_outside_a_region_fails(tmp_path):
    r = audit(compile_(tmp_path, "attribute.cpp", "-O0"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "axpy8(float*, float const*, float): above-baseline code outside an ISA namespace" in r.stdout, r.stdout
    assert "caller(float*, float const*): above-baseline code" in r.stdout, r.stdout


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_the_same_code_in_an_isa_region_passes(tmp_path, opt):
    region = compile_(tmp_path, "region.cpp", opt)
    r = audit(compile_(tmp_path, "portable.cpp", opt), region)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no leak" in r.stdout
    # the region's code is AVX-512 and lives in the word's namespace; the vector growth it calls is portable
    nm = subprocess.run(["nm", "-C", region], capture_output=True, text=True, check=True).stdout
    assert "moe_cpu::kernels::avx512vnni::region_sum(float)" in nm or opt == "-O2"
    inner = "moe_cpu::kernels::avx512vnni::nested_sum(float const*)::{lambda(int)#1}::operator()(int) const::{lambda(int)#1}"
    assert inner in nm or opt == "-O2"   # the nested lambda is an external symbol at -O0, and passes
    dis = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", region], capture_output=True, text=True,
                         check=True).stdout
    assert "zmm" in dis
    grow = dis.split("std::vector<float, std::allocator<float> >::_M_default_append(unsigned long)>:")[1].split("\n\n")[0]
    assert "zmm" not in grow and "ymm" not in grow and "\tv" not in grow


def test_the_audit_refuses_nothing_to_audit(tmp_path):
    r = audit(str(tmp_path))
    assert r.returncode != 0 and "no object files" in r.stderr
