#!/usr/bin/env bash
# What issue 26 needs from a host with AMX (an Intel Xeon, or a lent device machine), in one go, logs under
# $OUT (default amx_out/): lscpu, the GoogleTest suite (the amx kernels on real tiles at every row count), the
# skeleton bench (bench/studies/amx_skeleton.cpp: its estimates beside the real tiles, one core), pytest's
# `isa` tests at MOE_CPU_ISA=amx with every expert on the tiles, `moe-cpu info`, and the bench: %roof per M, the
# AMX crossover, and kt-kernel where it is installed (pip install kt-kernel==0.7.2 --no-deps).
#   bash scripts/amx_host.sh
#   SHAPES=qwen3-30b-a3b MS=1,1024 SCHEMES=int8_w8a8 bash scripts/amx_host.sh   # a shorter bench
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-amx_out}")
SHAPES=${SHAPES:-qwen3-30b-a3b,deepseek-v3}
MS=${MS:-1,16,128,1024,4096}
SCHEMES=${SCHEMES:-int8_w8a8,int4_w4a8,bf16,fp8_w8a16,int4_w4a16,int8_w8a16}
mkdir -p "$OUT"
lscpu > "$OUT/lscpu.txt"
grep -ow 'amx_[a-z0-9]*' "$OUT/lscpu.txt" | sort -u | tr '\n' ' '; echo "(lscpu AMX flags)"
step() { echo "== $1"; shift; "$@"; echo "   rc=$?"; }
step "C++ build and tests -> gtest.txt" bash -c "cmake -S . -B build/amx -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOE_CPU_BUILD_PYTHON=OFF > '$OUT/cmake.txt' 2>&1 && cmake --build build/amx -j $(nproc) >> '$OUT/cmake.txt' 2>&1 \
  && build/amx/moe_cpu_tests --gtest_brief=1 > '$OUT/gtest.txt' 2>&1; tail -n 3 '$OUT/gtest.txt'"
step "install" bash -c "python3 -m pip install -q --no-build-isolation --no-deps -C build-dir=build/py . > '$OUT/pip.txt' 2>&1"
cd tests
step "moe-cpu info -> info.txt" bash -c "python3 -m moe_cpu info > '$OUT/info.txt' 2>&1; grep -E '^AMX|int8_w8a8' '$OUT/info.txt'"
if ! python3 -c "import moe_cpu, sys; sys.exit('amx' not in moe_cpu.cpu_features()['detected'])"; then
  echo "AMX is not usable here: $(python3 -c "import moe_cpu; print(moe_cpu.cpu_features()['amx'])")"
  exit 1
fi
step "pytest -m isa at amx, every expert on the tiles -> pytest_amx.txt" bash -c "MOE_CPU_ISA=amx MOE_CPU_AMX_MIN_ROWS=1 \
  python3 -m pytest -q -p no:cacheprovider -m isa python > '$OUT/pytest_amx.txt' 2>&1; tail -n 1 '$OUT/pytest_amx.txt'"
step "bench -> bench.txt, bench/bench_moe.json" bash -c "python3 -m moe_cpu bench --shapes $SHAPES --m $MS --schemes $SCHEMES \
  --no-peers --kt-peer --amx-crossover --out '$OUT/bench' > '$OUT/bench.txt' 2>&1; grep -E 'machine:|crossover:|kt-kernel' '$OUT/bench.txt'"
step "A16 against A8 on the same codes (bench/a16_vs_a8.py) -> a16_vs_a8.txt" bash -c "python3 ../bench/a16_vs_a8.py \
  > '$OUT/a16_vs_a8.txt' 2>&1; tail -n 16 '$OUT/a16_vs_a8.txt'"
step "skeleton bench, one core -> skeleton.txt" bash -c "OMP_NUM_THREADS=1 ../build/amx/moe_cpu_amx_skeleton 7 > '$OUT/skeleton.txt' 2>&1; \
  cat '$OUT/skeleton.txt'"
