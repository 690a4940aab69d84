#!/usr/bin/env bash
# Runs every test: the GoogleTest suite (plain, under ASan+UBSan, AArch64 under qemu) and pytest (all of it at the
# native level, the `isa`-marked tests again at every other ISA level, the DLPack tests under ASan).
#   bash scripts/test.sh          # everything (what .ci/run runs)
#   bash scripts/test.sh quick    # contributors: re-install the package incrementally, Release ctest, one native
#                                 # pytest run without the `slow` tests
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
MODE=${1:-full}
case "$MODE" in full|quick) ;; *) echo "usage: bash scripts/test.sh [quick]" >&2; exit 2 ;; esac
if [ "$MODE" = quick ]; then
  echo "== install (incremental build in build/py)"
  python3 -m pip install -q --no-build-isolation --no-deps -C build-dir=build/py . 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
echo "== C++ tests (Release)"
cmake -S . -B build/ctest -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
cmake --build build/ctest -j "$JOBS"
ctest --test-dir build/ctest --output-on-failure -j "$JOBS" | tail -n 3
if [ "$MODE" = quick ]; then
  echo "== pytest, native level, without the slow tests"
  (cd tests && python3 -m pytest -q -p no:cacheprovider -m "not slow" python)
  exit 0
fi
echo "== C++ tests (ASan + UBSan)"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_CPU_SANITIZE=ON -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
cmake --build build/asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure -j "$JOBS" | tail -n 3
# The Stream's queue and hand-off under ThreadSanitizer (its tests' tasks run no OpenMP region, whose runtime TSan
# does not see).
echo "== C++ Stream tests under ThreadSanitizer"
cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_CPU_TSAN=ON -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
cmake --build build/tsan -j "$JOBS" --target moe_cpu_tests | tail -n 1
TSAN_OPTIONS=halt_on_error=1 build/tsan/moe_cpu_tests --gtest_filter='Stream*' --gtest_brief=1 | tail -n 3
echo "== C++ tests, AArch64 cross build under qemu-aarch64 -cpu max, once per forced ISA level"
cmake -S . -B build/arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
cmake --build build/arm -j "$JOBS"
for level in neon neon_dotprod neon_i8mm neon_bf16; do
  echo "-- MOE_CPU_ISA=$level"
  MOE_CPU_ISA=$level qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu build/arm/moe_cpu_tests --gtest_brief=1 | tail -n 3
done
# Other CPUs from this host (qemu-user): the ISA audit, Debug GoogleTest on an AVX2-only, a pre-AVX and an Armv8.0
# CPU, and pytest subsets under the x86 ones (scripts/test_emulated.sh says what runs and what is left out).
echo "== emulated CPUs (scripts/test_emulated.sh)"
bash scripts/test_emulated.sh
# pytest: the whole suite at the native level, then the `isa`-marked tests (those whose result depends on the kernel)
# once per other ISA level this CPU has (MOE_CPU_ISA forces dispatch; test_dispatch checks the path taken), amx_model
# included. It runs
# from tests/ so that the source tree (no built _core) does not shadow the install.
LEVELS=$(cd tests && python3 -c "
import moe_cpu
f = set(moe_cpu.cpu_features()['detected'])
print(' '.join(['native'] + [l for l, need in (('amx', 'amx'), ('avx512', 'avx512'), ('avx512_novbmi', 'avx512_vbmi'), ('avx2vnni', 'avx_vnni'), ('avx2', 'avx2'), ('amx_model', 'amx_model'), ('neon', 'neon')) if need in f] + ['reference']))")
# AMX: the level amx runs where the CPU has it and the OS granted the tile state (moe-cpu info says why not);
# amx_model (the AMX kernels' template on the scalar tile model) runs on every x86 host.
if lscpu 2>/dev/null | grep -qw amx_int8 && ! grep -qw amx <<<"$LEVELS"; then
  echo "note: lscpu lists amx_int8 but dispatch may not use it: $(cd tests && python3 -c 'import moe_cpu; print(moe_cpu.cpu_features()["amx"])')"
fi
# Without AMX, the level amx still runs the amx kernels' own code where the CPU has the AVX-512 they need:
# tests/amx_trap (built with the C++ tests) is preloaded, and its SIGILL handler runs each tile
# instruction on the scalar tile model ("amx~trap" below).
TRAP=$PWD/build/ctest/libmoe_cpu_amx_trap.so
if ! grep -qw amx <<<"$LEVELS" && [ -f "$TRAP" ]; then
  why=$(cd tests && LD_PRELOAD=$TRAP python3 -c 'import moe_cpu; print(moe_cpu.cpu_features()["amx"])')
  if [[ $why == emulated:* ]]; then LEVELS="$LEVELS amx~trap"; else echo "note: no amx level here: $why"; fi
fi
for level in $LEVELS; do
  if [ "$level" = native ]; then select=(); else select=(-m isa); fi
  rows=${MOE_CPU_AMX_MIN_ROWS:-}
  preload=${LD_PRELOAD:-}
  if [ "$level" = amx~trap ]; then level=amx preload=$TRAP; fi
  if [ "$level" = amx ]; then rows=1; fi  # every expert on the tiles (native keeps the default crossover)
  echo "== pytest, MOE_CPU_ISA=$level ${select[*]}${rows:+ MOE_CPU_AMX_MIN_ROWS=$rows}${preload:+ LD_PRELOAD=$preload}"
  (cd tests && LD_PRELOAD=$preload MOE_CPU_ISA=$level MOE_CPU_AMX_MIN_ROWS=$rows \
    python3 -m pytest -q -p no:cacheprovider "${select[@]}" python)
done
# The DLPack import hands producers' memory to the core: run its tests against an ASan + UBSan build of
# the extension (its own build dir and target; LD_PRELOAD puts the sanitizer runtimes before Python's). A Debug
# build: ASan checks every access at -O0 as well, and -O3 with the sanitizers took 18 of CI's 64 minutes to compile.
echo "== pytest test_dlpack.py, extension under ASan + UBSan"
rm -rf build/py-asan-site
python3 -m pip install -q --no-build-isolation --no-deps --target build/py-asan-site \
  -C cmake.define.MOE_CPU_SANITIZE=ON -C cmake.build-type=Debug -C build-dir=build/py-asan . 2>&1 \
  | grep -v "Running pip as the 'root' user" || true
(cd tests && LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$PWD/../build/py-asan-site" \
  python3 -c "import moe_cpu, sys; assert 'py-asan-site' in moe_cpu.__file__, moe_cpu.__file__" && \
  LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$PWD/../build/py-asan-site" \
  python3 -m pytest -q -p no:cacheprovider python/test_dlpack.py)
