#!/usr/bin/env bash
# benchmarks/gpu/oom.py on a GPU host: a real out-of-memory under
# OMNIQ_WORKER__MEMORY_FRACTION on one GPU.
# On a machine with a package index, build the wheelhouse (the wheels the GPU host's python3
# lacks): `python -m benchmarks.device.wheelhouse` -> .wheelhouse/wheels.tar.xz. Copy the
# repository with .wheelhouse/ to the GPU host (it needs no package index) and run there
# from the copy:
#   bash benchmarks/device/gpu_oom.sh [gpu/oom.py args]
# JSON to $OUT/gpu_oom.json, stderr to $OUT/gpu_oom.log (OUT: ./device-out unless set). The
# script keeps to its --budget-s (210 s) and is killed at BENCH_TIMEOUT_S (240 s). Exit
# status 0 only when the JSON says oom_recovered: 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
export BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-240}
run_bench gpu.oom "$@" || true # the JSON says how it went; no JSON fails below
summary gpu_oom device commit memory_fraction oom_recovered oom_step oom_to_terminal_ms \
    oom_to_fail_written_ms baseline_mib after_mib in_progress_reads_after_oom \
    in_progress_reads_after_failed next_job_status run_s error
"$VENV/bin/python" -c 'import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("oom_recovered") == 1 else 1)' "$OUT/gpu_oom.json"
