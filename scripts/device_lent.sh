#!/usr/bin/env bash
# What a session runs on a lent device machine (16 cores, maybe AMX, maybe a CUDA GPU; no registry), in one go.
# Carried in .devcarry/ (git-excluded): eigen3/ and eigen3cmake/ (this host's /usr/include/eigen3 and
# /usr/share/eigen3/cmake), a gguf wheel, bin/ (moe_cpu_tests, moe_cpu_amx_skeleton, libmoe_cpu_amx_trap.so from a
# Release build here). Logs go to $OUT/device_logs.tgz (re-packed after every step, so a cut-off run keeps them).
#   OUT=/tmp/o bash scripts/device_lent.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-device_out}"); L=/tmp/device_logs; mkdir -p "$OUT" "$L"
pack() { tar czf "$OUT/device_logs.tgz" -C "$L" . ; }
step() { local t=$1 name=$2; shift 2; echo "== $name ($(date +%T))"; timeout "$t" "$@"; echo "   rc=$? ($(date +%T))"; pack; }
{ lscpu; nproc; free -g; nvidia-smi -L; python3 --version; } > "$L/lscpu.txt" 2>&1
grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)' "$L/lscpu.txt"; grep -ow 'amx_[a-z0-9]*' "$L/lscpu.txt" | sort -u | tr '\n' ' '; echo
cp -r .devcarry/eigen3 /usr/include/ && mkdir -p /usr/share/eigen3 && cp -r .devcarry/eigen3cmake /usr/share/eigen3/cmake
python3 -m pip install -q --no-index --no-deps .devcarry/gguf-*.whl > "$L/pip_gguf.txt" 2>&1
[ -n "${SKIP_INSTALL:-}" ] || step 300 "install (build on $(nproc) cores)" bash -c "CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q \
  --no-build-isolation --no-deps -C build-dir=/tmp/bpy . > '$L/pip.txt' 2>&1; tail -n 3 '$L/pip.txt'"
cd tests
step 60 "moe-cpu info" bash -c "python3 -m moe_cpu info > '$L/info.txt' 2>&1; grep -E '^AMX|ISA|int8_w8a8' '$L/info.txt' | head"
sleep 5; step 180 "scaling 1-16 threads" python3 ../bench/scaling.py --out "$L/scaling.log"
if nvidia-smi -L > /dev/null 2>&1; then
  step 120 "Stream.capture from cudaLaunchHostFunc" bash -c "python3 ../bench/stream_cuda_host.py > '$L/stream_cuda.log' 2>&1; \
    cat '$L/stream_cuda.log'"
fi
if python3 -c "import moe_cpu, sys; sys.exit('amx' not in moe_cpu.cpu_features()['detected'])"; then
  B=../.devcarry/bin; mkdir -p ../build/py && cp $B/libmoe_cpu_amx_trap.so ../build/py/   # test_dispatch's tile count
  step 90 "gtest on real tiles" bash -c "$B/moe_cpu_tests --gtest_brief=1 > '$L/gtest.txt' 2>&1; tail -n 3 '$L/gtest.txt'"
  step 120 "pytest -m isa at amx, every expert on the tiles" bash -c "MOE_CPU_ISA=amx MOE_CPU_AMX_MIN_ROWS=1 python3 -m \
    pytest -q -p no:cacheprovider -n 8 -m isa \$(python3 -c 'import jupyter_client' 2>/dev/null || echo --ignore=python/test_notebook.py) \
    python > '$L/pytest_amx.txt' 2>&1; tail -n 1 '$L/pytest_amx.txt'"
  step 90 "GGUF g32 forms, tiles against the twin" bash -c "python3 ../bench/studies/amx_g32_forms.py > '$L/g32_forms_tiles.txt' 2>&1; \
    cat '$L/g32_forms_tiles.txt'"
  step 90 "bench" bash -c "python3 -m moe_cpu bench --shapes qwen3-30b-a3b --m 1,128,1024 --schemes \
    int8_w8a8,int4_w4a8,bf16,int4_w4a16 --no-peers --amx-crossover --out '$L/bench' > '$L/bench.txt' 2>&1; \
    grep -E 'machine:|crossover:' '$L/bench.txt'"
  step 40 "skeleton, one core" bash -c "OMP_NUM_THREADS=1 $B/moe_cpu_amx_skeleton 7 > '$L/skeleton.txt' 2>&1; tail -n 5 '$L/skeleton.txt'"
else
  echo "no AMX: $(python3 -c "import moe_cpu; print(moe_cpu.cpu_features()['amx'])")"
fi
pack
