#!/usr/bin/env bash
# The multi-GPU rows on a host with N GPUs: N single-GPU workers against one
# (benchmarks/gpu/scaleout.py), then one job on N GPUs against one (benchmarks/gpu/parallel.py,
# 81 frames).
# On a machine with a package index, build the wheelhouse (the wheels the GPU host's python3
# lacks): `python -m benchmarks.device.wheelhouse` -> .wheelhouse/wheels.tar.xz. Copy the
# repository with .wheelhouse/ to the GPU host (it needs no package index) and run there
# from the copy:
#   bash benchmarks/device/gpu_multi.sh N [gpu/parallel.py args]      # N: 2 unless given
# JSON to $OUT/gpu_scaleout.json and $OUT/gpu_parallel.json (OUT: ./device-out unless set).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
N=${1:-2}
shift || true
gpus=$(gpu_check)
printf '%s\n' "$gpus"
if [ "$(printf '%s\n' "$gpus" | wc -l)" -lt "$N" ]; then
    echo "gpu_multi.sh: $N GPUs asked for, $(printf '%s\n' "$gpus" | wc -l) on this host" >&2
    exit 2
fi
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
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
