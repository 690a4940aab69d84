#!/usr/bin/env bash
# Runs every test: the GoogleTest suite (plain and under ASan+UBSan) and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
echo "== C++ tests (Release)"
cmake -S . -B build/ctest -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
cmake --build build/ctest -j "$JOBS"
ctest --test-dir build/ctest --output-on-failure -j "$JOBS" | tail -n 3
echo "== C++ tests (ASan + UBSan)"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_CPU_SANITIZE=ON -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
cmake --build build/asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure -j "$JOBS" | tail -n 3
# pytest runs once per ISA level this CPU has (MOE_CPU_ISA forces dispatch; test_dispatch checks the
# path taken). It runs from tests/ so that the source tree (no built _core) does not shadow the install.
LEVELS=$(cd tests && python3 -c "
import moe_cpu
f = set(moe_cpu.cpu_features()['detected'])
print(' '.join(['native'] + [l for l, need in (('avx512', 'avx512'), ('avx2', 'avx2'), ('neon', 'neon')) if need in f] + ['reference']))")
for level in $LEVELS; do
  echo "== pytest, MOE_CPU_ISA=$level"
  (cd tests && MOE_CPU_ISA=$level python3 -m pytest -q -p no:cacheprovider python)
done
