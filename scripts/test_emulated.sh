#!/usr/bin/env bash
# Other CPUs, from any host: the ISA audit of every build, then the suite on CPUs emulated by qemu-user (TCG;
# qemu 7.2 has AVX2 and no AVX-512). Part of `bash scripts/test.sh` (full runs only); also runs alone after
# `bash scripts/setup.sh`:  bash scripts/test_emulated.sh
#   EPYC-Milan (Zen 3: AVX2, FMA, no AVX-512): GoogleTest from a Debug (-O0) build, where nothing is inlined, so
#       a leaked ISA function would run and die of SIGILL; then a pytest subset of the `isa` tests (below).
#   Nehalem (x86-64-v2, no AVX; NumPy 2.4 needs v2, so not qemu64): GoogleTest (Debug), import, `moe-cpu info`,
#       and the reference path's numerics on every scheme.
#   cortex-a72 (Armv8.0: no dotprod, i8mm or BF16): the AArch64 GoogleTest suite from a Debug build.
# Each run checks that dispatch chose what that CPU allows: MOE_CPU_EXPECT_ISA (precision:isa per scheme) is
# asserted by FusedExperts.DispatchedPathMatchesReferenceForEveryScheme, and the Python runs check
# cpu_features()["kernels"]. A level the CPU lacks (MOE_CPU_ISA=avx512 on Zen 3, avx2 on Nehalem) must still be
# a clear ValueError.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
PY=$(python3 -c 'import sys; print(sys.executable)')  # the interpreter itself (python3 may be a shell shim)
# NumPy 2.4's bundled OpenBLAS takes qemu's Nehalem model for a "Katmai" and dies of SIGILL in `import numpy`
# (SandyBridge and later are detected right); naming the core type keeps its SSE4.2 kernels on both emulated CPUs.
export OPENBLAS_CORETYPE=Nehalem
quiet() { grep -v "^qemu-x86_64: warning: TCG doesn't support requested feature" || true; }
# Runs a command; prints its last lines, or where it fails: GoogleTest's failures (skip messages can push them out
# of the last 80 lines), then its last 80.
failures() { grep -E -A 20 "Failure|\[  FAILED  \]|Segmentation fault|Aborted" || true; }
run() {
  local log rc=0
  log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then quiet <"$log" | tail -n 2; else
    { failures <"$log" | head -n 80; } || true; quiet <"$log" | tail -n 80; echo "FAILED ($rc): $*" >&2
  fi
  rm -f "$log"
  return $rc
}
t0=$SECONDS

echo "-- ISA audit (scripts/isa_audit.py): no ISA code outside an ISA namespace, no object with ISA flags"
cmake -S . -B build/debug -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null
cmake --build build/debug -j "$JOBS" | tail -n 1
cmake -S . -B build/arm-debug -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Debug \
  -DMOE_CPU_BUILD_PYTHON=OFF >/dev/null 2>&1
cmake --build build/arm-debug -j "$JOBS" | tail -n 1
python3 scripts/isa_audit.py build/debug
ARM_BINUTILS=(--objdump aarch64-linux-gnu-objdump --readelf aarch64-linux-gnu-readelf)
python3 scripts/isa_audit.py "${ARM_BINUTILS[@]}" build/arm-debug
if [ -d build/arm ]; then python3 scripts/isa_audit.py "${ARM_BINUTILS[@]}" build/arm; fi

ALL() { echo "w4a8:$1 w8a8:$1 fp8w:$1 bf16:$1 w4a16:$1 w8a16:$1"; }
# Python under a CPU model: the installed extension picks `want` for every scheme (cpu_features()["kernels"]).
py_dispatch() {  # cpu want
  (cd tests && qemu-x86_64 -cpu "$1" "$PY" -c "
import moe_cpu
k = moe_cpu.cpu_features()['kernels']
assert all(v.split('_')[1] == '$2' for v in k.values()), k
print('dispatch on $1:', ' '.join(sorted(k.values())))") 2>&1 | quiet
}
py_refused() {  # cpu level: forcing a level the CPU lacks is a clear error
  local out
  out=$(cd tests && MOE_CPU_ISA=$2 qemu-x86_64 -cpu "$1" "$PY" -c "import moe_cpu; moe_cpu.cpu_features()" 2>&1 | quiet) && {
    echo "MOE_CPU_ISA=$2 on $1 was not refused" >&2; exit 1; }
  grep -q "ValueError: MOE_CPU_ISA = '$2' needs CPU features this machine lacks" <<<"$out" || { echo "$out" >&2; exit 1; }
  echo "MOE_CPU_ISA=$2 on $1: $(tail -n 1 <<<"$out")"
}

echo "-- EPYC-Milan (AVX2 only): GoogleTest (Debug, -O0)"
run env MOE_CPU_EXPECT_ISA="$(ALL avx2)" qemu-x86_64 -cpu EPYC-Milan build/debug/moe_cpu_tests --gtest_brief=1
py_dispatch EPYC-Milan avx2
py_refused EPYC-Milan avx512
# The pytest subset: the kernel-dependent suites (numerics: every scheme x activation x option; weight forms;
# activation blocks; act-order; dispatch) at the native level, ~400 tests, ~35 s under TCG. The whole `isa` set takes ~3 min there,
# over this stage's budget; what is left out runs the same avx2 kernels at MOE_CPU_ISA=avx2 in scripts/test.sh,
# natively: the suites of layers, threads, amx, the GGUF / GPTQ / AWQ / MXFP4 / safetensors loaders, packed
# files, outliers, the property test and the vLLM surface, and numerics' two slowest (test_gemm1_epilogue_pieces,
# large shapes; test_layer_quantization_quality, weight quantization), 60% of its time under TCG.
# Excluded here: test_force_isa_changes_later_packing_only and test_avx2vnni_level_needs_avx_vnni compare their
# child process's dispatch with this one's, and qemu-user does not follow exec, so the child runs on the host CPU
# (on a Zen 5 or Intel host with AVX-VNNI the child may take the avx2vnni level that EPYC-Milan lacks).
echo "-- EPYC-Milan: pytest -m isa (subset), native level"
(cd tests && run qemu-x86_64 -cpu EPYC-Milan "$PY" -m pytest -q -p no:cacheprovider -m isa \
  -k "not test_force_isa_changes_later_packing_only and not test_avx2vnni_level_needs_avx_vnni and not test_gemm1_epilogue_pieces and not test_layer_quantization_quality" \
  python/test_numerics.py python/test_weight_forms.py python/test_act_blocks.py \
  python/test_act_order.py python/test_dispatch.py)

echo "-- Nehalem (x86-64-v2, no AVX): GoogleTest (Debug), import, moe-cpu info, reference numerics"
run env MOE_CPU_EXPECT_ISA="$(ALL reference)" qemu-x86_64 -cpu Nehalem build/debug/moe_cpu_tests --gtest_brief=1
py_dispatch Nehalem reference
py_refused Nehalem avx2
info=$(cd tests && qemu-x86_64 -cpu Nehalem "$PY" -m moe_cpu info 2>&1 | quiet)
grep -q "^tier: *reference" <<<"$info" || { echo "$info" >&2; exit 1; }
grep -E "^(tier|detected features):" <<<"$info"
(cd tests && run qemu-x86_64 -cpu Nehalem "$PY" -m pytest -q -p no:cacheprovider python/test_numerics.py \
  -k "test_scheme_activation or test_bf16_input")

echo "-- cortex-a72 (Armv8.0 NEON): AArch64 GoogleTest (Debug)"
run env MOE_CPU_EXPECT_ISA="w4a8:reference w8a8:reference fp8w:neon bf16:neon w4a16:neon w8a16:neon" \
  qemu-aarch64 -cpu cortex-a72 -L /usr/aarch64-linux-gnu build/arm-debug/moe_cpu_tests --gtest_brief=1
echo "-- emulated CPUs: $((SECONDS - t0)) s"
