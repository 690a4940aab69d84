#!/usr/bin/env bash
# Expert-parallel scaling on one host: 1, 2 and 4 ranks (4 oversubscribed on a 2-core machine) over
# Open MPI's shared-memory transport, Qwen3 and DeepSeek shapes, M = 1 and 512. Log: docs/bench/ep_scaling.log.
# Unbound (--bind-to none), so threads per rank = cores / ranks: 1 rank runs 2 threads, 2 and 4 ranks 1 each.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
OUT=${OUT:-bench_out}
LOG=${LOG:-docs/bench/ep_scaling.log}
{
  echo "# $(date -u +%F) $(lscpu | grep 'Model name' | sed 's/  */ /g'), $(nproc) cores"
  for n in 1 2 4; do
    over="--bind-to none"; [ "$n" -gt "$(nproc)" ] && over="--oversubscribe --bind-to none"
    echo "## mpirun -np $n $over moe-cpu bench --ep $*"
    mpirun -np "$n" $over moe-cpu bench --ep --out "$OUT" "$@"
  done
} 2>&1 | tee "$LOG"
