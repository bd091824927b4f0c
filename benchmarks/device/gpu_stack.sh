#!/usr/bin/env bash
# benchmarks/gpu/stack.py on a GPU host: the whole stack on one GPU.
# On a machine with a package index, build the wheelhouse (the wheels the GPU host's python3
# lacks): `python -m benchmarks.device.wheelhouse` -> .wheelhouse/wheels.tar.xz. Copy the
# repository with .wheelhouse/ to the GPU host (it needs no package index) and run there
# from the copy:
#   bash benchmarks/device/gpu_stack.sh [gpu/stack.py args]
# JSON to $OUT/gpu_stack.json, stderr to $OUT/gpu_stack.log (OUT: ./device-out unless set).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
run_bench gpu.stack "$@"
"$VENV/bin/python" - "$OUT/gpu_stack.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
keys = ("gpu", "full_stack_wall_over_raw", "cancel_p95_ms", "block_ms",
        "checkpoint_overhead_ratio", "raw_wall_s")
print({k: d.get(k) for k in keys})
print("gates", d["gates"]["step_ms"], d["gates"]["overhead_ratio"], d["gates"]["in_process_stop_ms"])
s = d.get("stack", {})
print("client_wall_s", s.get("client_wall_s"), "memory", s.get("cuda_allocated_mib_after_each_job"))
for c in s.get("cancels", []):
    print(" ", c)
PY
