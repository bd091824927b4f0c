#!/usr/bin/env bash
# benchmarks/gpu/oom.py on the lent GPU machine (a real out-of-memory under
# OMNIQ_WORKER__MEMORY_FRACTION on one H200), with the wheelhouse carried:
# run(command="bash benchmarks/device/gpu_oom.sh [gpu/oom.py args]", carry=[".wheelhouse"],
# timeout_s=330). JSON to $OUT/gpu_oom.json, stderr to $OUT/gpu_oom.log. The script keeps to
# its --budget-s (210 s) and is killed at BENCH_TIMEOUT_S (240 s). Exit status 0 only when
# the JSON says oom_recovered: 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
export BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-240}
run_bench gpu.oom "$@" || true # the JSON says how it went; no JSON fails below
summary gpu_oom device commit memory_fraction oom_recovered oom_step oom_to_terminal_ms \
    oom_to_fail_written_ms baseline_mib after_mib in_progress_reads_after_oom \
    in_progress_reads_after_failed next_job_status run_s error
"$VENV/bin/python" -c 'import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("oom_recovered") == 1 else 1)' "$OUT/gpu_oom.json"
