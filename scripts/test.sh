#!/usr/bin/env bash
# Runs the tests (after `bash scripts/setup.sh`, which builds build/py: the extension and the Release C++ tests).
#   bash scripts/test.sh          # everything (what .ci/run runs): the GoogleTest suite (plain, under ASan + UBSan,
#                                 # the Stream under TSan, AArch64 under qemu), the emulated CPUs, pytest (all of it at
#                                 # the native level, the `isa` tests again at every other ISA level, the DLPack tests
#                                 # against an ASan build of the extension)
#   bash scripts/test.sh quick    # while developing: re-install only if a source changed, the GoogleTest suite, the
#                                 # native pytest run without `slow`, one thread per test on every core (pytest-xdist)
# The full run keeps both cores busy: the ASan, AArch64 and emulated-CPU builds and their qemu runs (lane "builds",
# logged to build/lane_builds.log and printed when it ends) beside the pytest levels, then TSan and the ASan extension.
# Each stage prints its seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
MODE=${1:-full}
case "$MODE" in full|quick) ;; *) echo "usage: bash scripts/test.sh [quick]   (modes: full, the default; quick)" >&2; exit 2 ;; esac
T0=$SECONDS
took() { echo "   ($1: $((SECONDS - $2)) s)"; }
# The package and the Release C++ tests: pip's incremental build in build/py (what setup.sh installed; one build of
# the core for both), skipped when no source is newer than the last install's stamp.
STAMP=build/py/.installed
install_if_changed() {
  local changed
  changed=$(find cpp bindings moe_cpu cmake CMakeLists.txt pyproject.toml tests/cpp tests/amx_trap bench/studies/amx_skeleton.cpp \
    -newer "$STAMP" -print -quit 2>/dev/null || echo x)
  if [ -f "$STAMP" ] && [ -z "$changed" ] && (cd tests && python3 -c "import moe_cpu" 2>/dev/null); then
    echo "== install: nothing changed since the last install ($STAMP)"; return
  fi
  echo "== install (incremental build in build/py)"
  local log rc=0
  log=$(mktemp)
  python3 -m pip install -q --no-build-isolation --no-deps -C build-dir=build/py -C cmake.define.MOE_CPU_BUILD_TESTS=ON . \
    >"$log" 2>&1 || rc=$?
  grep -v "Running pip as the 'root' user" "$log" || true
  rm -f "$log"
  [ $rc -eq 0 ] || { echo "the install failed ($rc): the stamp stays old" >&2; return 1; }
  touch "$STAMP"
}
# Runs ctest on build dir $1 (more arguments: ctest's); prints its summary, or its whole log where a test failed. A
# tree with no tests fails (a build/py configured without MOE_CPU_BUILD_TESTS would otherwise pass).
ctest_in() {
  local dir=$1 log; shift
  log=$(mktemp)
  if ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$JOBS" "$@" >"$log" 2>&1; then
    grep -E "tests passed" "$log"; rm -f "$log"
  else
    cat "$log"; rm -f "$log"; echo "ctest failed in $dir" >&2; return 1
  fi
}
if [ "$MODE" = quick ]; then
  t=$SECONDS; install_if_changed; took "install and C++ build" $t
  echo "== C++ tests (Release; the ISA audit of the objects runs in the full run)"
  t=$SECONDS; ctest_in build/py -E '^isa_audit$'; took ctest $t
  echo "== pytest, native level, without the slow tests (pytest-xdist, $JOBS workers of one thread)"
  t=$SECONDS
  (cd tests && OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider -m "not slow" -n "$JOBS" -p no:benchmark python)
  took pytest $t
  echo "== quick: $((SECONDS - T0)) s"
  exit 0
fi

install_if_changed
echo "== C++ tests (Release, build/py)"
t=$SECONDS; ctest_in build/py; took "C++ Release" $t

# Lane "builds": every other C++ build and what runs on it, beside the pytest levels below.
builds_lane() {
  set -euo pipefail
  local t
  echo "== C++ tests (ASan + UBSan)"
  t=$SECONDS
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_CPU_SANITIZE=ON -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
  cmake --build build/asan -j "$JOBS" | tail -n 1
  # The ISA audit reads the Release objects (above) and the Debug ones (test_emulated.sh): over these it took 5 minutes.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest_in build/asan -E '^isa_audit$'
  took ASan $t
  echo "== C++ tests, AArch64 cross build under qemu-aarch64 -cpu max, once per forced ISA level (two at a time)"
  t=$SECONDS
  cmake -S . -B build/arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
  cmake --build build/arm -j "$JOBS" | tail -n 1
  local level pids=() rc=0
  for level in neon neon_dotprod neon_i8mm neon_bf16; do  # qemu-user runs one guest core: two levels at once
    (MOE_CPU_ISA=$level qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu build/arm/moe_cpu_tests --gtest_brief=1 \
      > "build/arm/$level.log" 2>&1) &
    pids+=($!)
    if [ ${#pids[@]} -ge "$JOBS" ]; then wait "${pids[0]}" || rc=1; pids=("${pids[@]:1}"); fi
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for level in neon neon_dotprod neon_i8mm neon_bf16; do echo "-- MOE_CPU_ISA=$level"; tail -n 3 "build/arm/$level.log"; done
  [ $rc -eq 0 ] || { echo "an AArch64 level failed (build/arm/<level>.log)" >&2; return 1; }
  took AArch64 $t
  # Other CPUs from this host (qemu-user): the ISA audit, Debug GoogleTest on an AVX2-only, a pre-AVX and an
  # Armv8.0 CPU, and pytest subsets under the x86 ones (scripts/test_emulated.sh says what runs and what is left out).
  echo "== emulated CPUs (scripts/test_emulated.sh)"
  t=$SECONDS; bash scripts/test_emulated.sh; took "emulated CPUs" $t
}
# After the pytest levels, beside the lane's emulated CPUs: the Stream under TSan and the ASan extension.
tsan_stage() {
  local t
  # The Stream's queue and hand-off under ThreadSanitizer (its tests' tasks run no OpenMP region, whose runtime
  # TSan does not see), built with only the code those tests run (moe_cpu_stream_tests: no kernel).
  echo "== C++ Stream tests under ThreadSanitizer"
  t=$SECONDS
  cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_CPU_TSAN=ON -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
  cmake --build build/tsan -j "$JOBS" --target moe_cpu_stream_tests | tail -n 1
  TSAN_OPTIONS=halt_on_error=1 build/tsan/moe_cpu_stream_tests --gtest_filter='Stream*' --gtest_brief=1 | tail -n 3
  took TSan $t
}
asan_extension_stage() {
  local t
  # The DLPack import hands producers' memory to the core: its tests run against an ASan + UBSan build of the
  # extension (its own build dir and target). A Debug build: ASan checks every access at -O0 as well, and -O3 with
  # the sanitizers took 18 of CI's 64 minutes to compile.
  echo "== extension under ASan + UBSan (for test_dlpack.py)"
  t=$SECONDS
  rm -rf build/py-asan-site
  python3 -m pip install -q --no-build-isolation --no-deps --target build/py-asan-site \
    -C cmake.define.MOE_CPU_SANITIZE=ON -C cmake.build-type=Debug -C build-dir=build/py-asan . 2>&1 \
    | grep -v "Running pip as the 'root' user" || true
  took "ASan extension" $t
}
LANE_LOG=build/lane_builds.log
echo "== lane builds: ASan, AArch64, emulated CPUs (log: $LANE_LOG)"
( builds_lane ) > "$LANE_LOG" 2>&1 &
LANE=$!
trap 'kill $LANE 2>/dev/null || true' EXIT

# pytest: the whole suite at the native level, then the `isa`-marked tests (those whose result depends on the
# kernel) once per other ISA level this CPU has (MOE_CPU_ISA forces dispatch; test_dispatch checks the path taken),
# amx_model included. A level whose kernels are the native level's (avx2 on a Zen 3, avx512 on a Zen 4) is not run
# twice. The levels after native run one thread per test on $JOBS workers (pytest-xdist); native keeps the default
# team. It runs from tests/ so that the source tree (no built _core) does not shadow the install.
kernels_at() { (cd tests && MOE_CPU_ISA=$1 python3 -c "import moe_cpu; print(sorted(moe_cpu.cpu_features()['kernels'].items()))"); }
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
TRAP=$PWD/build/py/libmoe_cpu_amx_trap.so
if ! grep -qw amx <<<"$LEVELS" && [ -f "$TRAP" ]; then
  why=$(cd tests && LD_PRELOAD=$TRAP python3 -c 'import moe_cpu; print(moe_cpu.cpu_features()["amx"])')
  if [[ $why == emulated:* ]]; then LEVELS="$LEVELS amx~trap"; else echo "note: no amx level here: $why"; fi
fi
NATIVE_KERNELS=$(kernels_at native)
for level in $LEVELS; do
  t=$SECONDS
  if [ "$level" = native ]; then select=() xdist=() one=(); else select=(-m isa) xdist=(-n "$JOBS" -p no:benchmark) one=(OMP_NUM_THREADS=1); fi
  rows=${MOE_CPU_AMX_MIN_ROWS:-}
  preload=${LD_PRELOAD:-}
  if [ "$level" = amx~trap ]; then level=amx preload=$TRAP; fi
  if [ "$level" = amx ]; then rows=1; fi  # every expert on the tiles (native keeps the default crossover)
  if [ "$level" != native ] && [ "$level" != amx ] && [ "$(kernels_at "$level")" = "$NATIVE_KERNELS" ]; then
    echo "== pytest, MOE_CPU_ISA=$level: the native level's kernels, run above"; continue
  fi
  echo "== pytest, MOE_CPU_ISA=$level ${select[*]}${rows:+ MOE_CPU_AMX_MIN_ROWS=$rows}${preload:+ LD_PRELOAD=$preload}"
  (cd tests && env LD_PRELOAD="$preload" MOE_CPU_ISA=$level MOE_CPU_AMX_MIN_ROWS="$rows" "${one[@]}" \
    python3 -m pytest -q -p no:cacheprovider "${select[@]}" "${xdist[@]}" python)
  took "pytest $level" $t
done

tsan_stage
asan_extension_stage
echo "== waiting for lane builds"
rc=0; wait $LANE || rc=$?
trap - EXIT
cat "$LANE_LOG"
[ $rc -eq 0 ] || { echo "lane builds failed ($rc): see above" >&2; exit $rc; }

echo "== pytest test_dlpack.py, extension under ASan + UBSan"
t=$SECONDS
(cd tests && LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$PWD/../build/py-asan-site" \
  python3 -c "import moe_cpu, sys; assert 'py-asan-site' in moe_cpu.__file__, moe_cpu.__file__" && \
  LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$PWD/../build/py-asan-site" \
  python3 -m pytest -q -p no:cacheprovider python/test_dlpack.py)
took "pytest DLPack ASan" $t
echo "== all tests: $((SECONDS - T0)) s"
