#!/usr/bin/env bash
# The multi-GPU rows on a lent machine with N GPUs (kind nvidia-h200-x2, -x4, …), with the
# wheelhouse carried: run(command="bash benchmarks/device/gpu_multi.sh 2", kind=…,
# carry=[".wheelhouse"]). N single-GPU workers against one (benchmarks/gpu/scaleout.py),
# then one job on N GPUs against one (benchmarks/gpu/parallel.py, 81 frames). JSON to
# $OUT/gpu_scaleout.json and $OUT/gpu_parallel.json; more args go to gpu/parallel.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-2}
shift || true
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.used --format=csv || true
# shellcheck source=benchmarks/device/venv.sh
source benchmarks/device/venv.sh
export OUT PYTHONUNBUFFERED=1
"$VENV/bin/python" -m benchmarks.gpu.scaleout --gpus "$N" >/dev/null 2> >(tee "$OUT/gpu_scaleout.log" >&2)
"$VENV/bin/python" -m benchmarks.gpu.parallel --gpus "$N" "$@" >/dev/null \
    2> >(tee "$OUT/gpu_parallel.log" >&2)
"$VENV/bin/python" - "$OUT" "$N" <<'PY'
import json, sys
out, n = sys.argv[1], sys.argv[2]
s = json.load(open(f"{out}/gpu_scaleout.json"))
print("scaleout", s.get(f"scaleout_{n}_workers"), s.get("runs"))
p = json.load(open(f"{out}/gpu_parallel.json"))
print("parallel", p.get("single_step_s"), {k: {x: v.get(x) for x in ("step_s", "speedup", "max_abs_frame_diff", "error")} for k, v in p.get("strategies", {}).items()})
PY
