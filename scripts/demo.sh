#!/usr/bin/env bash
# Runs the demo against the installed package (from outside the source tree, which has no built _core).
set -euo pipefail
cd "${TMPDIR:-/tmp}"
exec python3 -m moe_cpu.demo "$@"
