"""The extension module keeps the symbols of its static archives to itself (CMakeLists.txt: --exclude-libs).

A toolchain that links libstdc++.a into the module (a GCC 13 in a CUDA image, beside Ubuntu's libstdc++ 14) used
to export libstdc++'s process-wide facet ids; they bound to the copy NumPy had loaded, and the import crashed at
the first number it formatted. What must hold: the dynamic symbol table defines no symbol of the core library
(moe_cpu::...) and none of libstdc++'s own objects (locale, ios_base, facets), whatever the toolchain linked.
"""
import platform
import shutil
import subprocess

import pytest

from moe_cpu import _core

pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="--exclude-libs is a GNU / LLVM ELF linker option")


def dynamic_definitions():
    nm = shutil.which("nm")
    assert nm, "binutils' nm is a build dependency (scripts/setup.sh installs it)"
    out = subprocess.run([nm, "-D", "--defined-only", "-C", _core.__file__], capture_output=True, text=True, check=True)
    return [ln.split(" ", 2)[2] for ln in out.stdout.splitlines() if ln.count(" ") >= 2]


def test_the_module_exports_its_init_and_the_capture_callbacks():
    names = dynamic_definitions()
    assert "PyInit__core" in names
    assert {"moe_cpu_host_submit", "moe_cpu_host_wait"} <= set(names)


def test_no_core_or_libstdcxx_object_is_exported():
    names = dynamic_definitions()
    core = [n for n in names if n.startswith("moe_cpu::")]
    assert not core, core[:5]
    runtime = [n for n in names if n.startswith(("std::locale", "std::ios_base", "std::num_put", "std::codecvt",
                                                  "std::ctype", "std::basic_ostream", "vtable for std::basic_ios"))]
    assert not runtime, runtime[:5]
    assert len(names) < 200, f"{len(names)} dynamic symbols: an archive's symbols leak (was 1277 before the fix)"
