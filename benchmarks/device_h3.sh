#!/usr/bin/env bash
# benchmarks/gpu_h3.py on the lent GPU machine (MiniMax-H3, 33 B random-weight transformer,
# in process), with the wheelhouse carried: run(command="bash benchmarks/device_h3.sh
# [gpu_h3.py args]", carry=[".wheelhouse"]). JSON to $OUT/gpu_h3.json, stderr to
# $OUT/gpu_h3.log; copy the JSON to docs/evidence/h3_h200.json.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/device_bench.sh
source benchmarks/device_bench.sh
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
# shellcheck source=benchmarks/device_venv.sh
source benchmarks/device_venv.sh
t0=$(date +%s)
PYTHONUNBUFFERED=1 OUT="$OUT" "$VENV/bin/python" -m benchmarks.gpu_h3 "$@" >/dev/null \
    2> >(tee "$OUT/gpu_h3.log" >&2)
echo "benchmark_s: $(($(date +%s) - t0))"
summary gpu_h3 packed_rows forward_eager_s forward_compiled_s h3_stack_over_raw \
    fasth3_inprocess_e2e_s h3_cancel_p95_ms block_ms h3_memory_after_jobs_mib
