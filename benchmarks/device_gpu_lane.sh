#!/usr/bin/env bash
# benchmarks/gpu_lane.py on the lent GPU machine (compiled blocks, cache tiers, LoRA and the
# compiled stack on one H200), with the wheelhouse carried:
# run(command="bash benchmarks/device_gpu_lane.sh [gpu_lane.py args]", carry=[".wheelhouse"]).
# JSON to $OUT/gpu_lane.json, stderr to $OUT/gpu_lane.log.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
# shellcheck source=benchmarks/device_venv.sh
source benchmarks/device_venv.sh
t0=$(date +%s)
PYTHONUNBUFFERED=1 OUT="$OUT" "$VENV/bin/python" benchmarks/gpu_lane.py "$@" >/dev/null \
    2> >(tee "$OUT/gpu_lane.log" >&2)
echo "benchmark_s: $(($(date +%s) - t0))"
"$VENV/bin/python" - "$OUT/gpu_lane.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
keys = ("gpu", "compiled_step_ratio", "recompiles_second_job", "compile_warmup_s",
        "cancel_p95_ms_compiled", "block_ms", "tier_denoise_ratio_high",
        "tier_denoise_ratio_fast", "lora_swap_ms_p95", "lora_recompiles",
        "full_stack_wall_over_raw_compiled", "compile_failed")
print({k: d.get(k) for k in keys})
print("eager", d.get("eager"), "compiled", d.get("compiled"))
print("tiers", d.get("tiers"))
print("lora_memory", d.get("lora_memory"))
s = d.get("stack", {})
print("client_wall_s", s.get("client_wall_s"), "raw", d.get("raw_wall_s"))
print("memory", s.get("cuda_allocated_mib_after_each_job"))
for c in s.get("cancels", []):
    print(" ", c)
PY
