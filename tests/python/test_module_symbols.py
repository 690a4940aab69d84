"""A C++ runtime linked statically stays inside the extension module (CMakeLists.txt: --exclude-libs).

A toolchain that links libstdc++.a into the module (a GCC 13 in a CUDA image, beside Ubuntu's libstdc++ 14) used
to export libstdc++'s process-wide (STB_GNU_UNIQUE) facet ids; they bound to the copy NumPy had loaded, and the
import crashed at the first number it formatted. This host's toolchain links libstdc++ dynamically, so the test
links a probe as that toolchain did (-static-libstdc++) with the option exactly as CMakeLists.txt spells it.
"""
import os
import platform
import re
import shutil
import subprocess

import pytest

from moe_cpu import _core

pytestmark = [pytest.mark.skipif(platform.system() != "Linux", reason="--exclude-libs is an ELF linker option"),
              pytest.mark.slow]  # builds and links C++: the full run, not `test.sh quick`
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUNTIME = re.compile(r"^\S+ \S (?:std::(?:locale|ios_base|num_put|codecvt|ctype|basic_ostream)|vtable for std::basic_ios)")
PROBE = r"""
#include <sstream>
#include <string>
extern "C" int probe(long v, char* out, int n) {
  std::ostringstream o;
  o << v;
  const std::string s = o.str();
  const int k = int(s.size()) < n - 1 ? int(s.size()) : n - 1;
  s.copy(out, k);
  out[k] = 0;
  return k;
}
"""


def exports(path):
    nm = shutil.which("nm")
    assert nm, "binutils' nm comes with g++ (scripts/setup.sh)"
    out = subprocess.run([nm, "-D", "--defined-only", "-C", path], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def cmake_exclude_option():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    m = re.search(r'"LINKER:(--exclude-libs,[^"]+)"', text)
    assert m, "CMakeLists.txt links _core with LINKER:--exclude-libs,..."
    return "-Wl," + m.group(1)


def test_the_module_exports_its_init_and_no_runtime_object():
    lines = exports(_core.__file__)
    names = [ln.split(" ", 2)[2] for ln in lines if ln.count(" ") >= 2]
    assert "PyInit__core" in names and {"moe_cpu_host_submit", "moe_cpu_host_wait"} <= set(names)
    assert not [ln for ln in lines if RUNTIME.search(ln)]


def test_a_static_libstdcxx_stays_inside_with_the_modules_option(tmp_path):
    gxx = shutil.which("g++")
    assert gxx, "g++ builds the package"
    src = tmp_path / "probe.cpp"
    src.write_text(PROBE)
    plain, hidden = str(tmp_path / "plain.so"), str(tmp_path / "hidden.so")
    base = [gxx, "-shared", "-fPIC", "-O2", str(src), "-static-libstdc++"]
    subprocess.run(base + ["-o", plain], check=True)
    subprocess.run(base + [cmake_exclude_option(), "-o", hidden], check=True)
    leaked = [ln for ln in exports(plain) if RUNTIME.search(ln)]
    assert len(leaked) > 50, "the probe should export libstdc++ without the option (else it tests nothing)"
    assert not [ln for ln in exports(hidden) if RUNTIME.search(ln)]
    import ctypes
    import numpy  # noqa: F401  (NumPy's libstdc++.so first, as at the module's import)
    buf = ctypes.create_string_buffer(32)
    assert ctypes.CDLL(hidden).probe(ctypes.c_long(-1234567), buf, 32) == 8 and buf.value == b"-1234567"
