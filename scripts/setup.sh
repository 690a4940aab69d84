#!/usr/bin/env bash
# Installs everything moe_cpu needs on a fresh Debian machine, then builds and installs the package.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# Eigen + GoogleTest; the AArch64 cross compiler and qemu-user prove the Arm kernels (scripts/test.sh);
# Open MPI runs the expert-parallel tests (mpirun; mpi4py builds against libopenmpi-dev).
PKGS="libeigen3-dev libgtest-dev googletest g++ g++-aarch64-linux-gnu qemu-user openmpi-bin libopenmpi-dev"
if ! dpkg -s $PKGS >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq $PKGS >/dev/null
fi
python3 -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python3 -m pip install -q cmake ninja scikit-build-core pybind11 numpy
# The package and the Release C++ tests (MOE_CPU_BUILD_TESTS: one build of the core links both), in build/py (no
# build isolation: the build tools above) so that `test.sh quick` rebuilds incrementally, or not at all while no
# source changed (build/py/.installed).
python3 -m pip install -q --no-build-isolation -C build-dir=build/py -C cmake.define.MOE_CPU_BUILD_TESTS=ON ".[test]"
touch build/py/.installed
# Test-only oracles and callers (never runtime): torch pinned to the CPU wheel these hosts carry (plain
# `torch` would download a CUDA build), transformers for the Hugging Face model checks, JAX (CPU) for the
# DLPack tests.
python3 -m pip install -q torch==2.13.0 transformers==5.23.0 jax==0.10.2 jaxlib==0.10.2
# ggml's own C dequantization (ik_llama.cpp's libggml, called through ctypes), the second oracle of the GGUF
# low-bit types (tests/python/test_gguf_quants.py), in build/ (not /tmp/ikpeer, the bench's peer).
[ -f build/ik_oracle/ik_llama_cpp/lib/libggml.so ] ||
  python3 -m pip install -q --no-deps --target build/ik_oracle ik-llama-cpp-python==0.1.5
(cd "${TMPDIR:-/tmp}" && python3 -c "import moe_cpu; print('moe_cpu', moe_cpu.__version__, 'installed; kernels:', moe_cpu.cpu_features()['kernels'])")
[ -x build/py/moe_cpu_tests ] || { echo "build/py has no C++ tests (MOE_CPU_BUILD_TESTS)" >&2; exit 1; }
