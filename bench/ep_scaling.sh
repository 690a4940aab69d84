#!/usr/bin/env bash
# Expert-parallel scaling on one host: moe-cpu bench --ep's time per call on 1, 2 and 4 MPI ranks, against 1 rank.
#
# Over Open MPI's shared-memory transport, Qwen3 and DeepSeek shapes, M = 1 and 512 (4 ranks oversubscribed on a
# 2-core machine). Unbound (--bind-to none), so threads per rank = cores / ranks: 1 rank runs 2 threads, 2 and 4
# ranks 1 each. Arguments go to `moe-cpu bench --ep` (--shapes, --m, --schemes, --experts, --calls, --sweep, ...).
# Environment: RANKS (default "1 2 4"), OUT (JSON, default bench/out), LOG (default bench/out/ep_scaling.log).
# Needs Open MPI's mpirun and mpi4py.
#
#   bash bench/ep_scaling.sh
#   RANKS=1 LOG=/tmp/ep.log OUT=/tmp/ep bash bench/ep_scaling.sh --shapes qwen3-30b-a3b --experts 8 --m 1 \
#       --calls 1 --sweep ''                                                                  # a quick check
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null; then
  echo "ep_scaling.sh: needs Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py)" >&2
  exit 2
fi
if ! python3 -c "import mpi4py" 2>/dev/null; then
  echo "ep_scaling.sh: needs mpi4py (pip install mpi4py)" >&2
  exit 2
fi
MOE=(moe-cpu); command -v moe-cpu >/dev/null || MOE=(python3 -m moe_cpu)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
OUT=${OUT:-bench/out}
LOG=${LOG:-bench/out/ep_scaling.log}
RANKS=${RANKS:-1 2 4}
for n in $RANKS; do
  case $n in ''|*[!0-9]*|0) echo "ep_scaling.sh: RANKS='$RANKS' must hold rank counts >= 1" >&2; exit 2 ;; esac
done
mkdir -p "$(dirname "$LOG")"
{
  echo "# $(date -u +%F) $(lscpu | grep 'Model name' | sed 's/  */ /g'), $(nproc) cores"
  for n in $RANKS; do
    over="--bind-to none"; [ "$n" -gt "$(nproc)" ] && over="--oversubscribe --bind-to none"
    echo "## mpirun -np $n $over moe-cpu bench --ep $*"
    mpirun -np "$n" $over "${MOE[@]}" bench --ep --out "$OUT" "$@"
  done
} 2>&1 | tee "$LOG"
