#!/usr/bin/env bash
# The GPU soak of issue 23 on a GPU host: benchmarks/load/run.py with the Wan worker
# (random-weight Wan2.1-1.3B, benchmarks/load/workloads/wan_h200.toml) at 90 % of its measured
# saturation for --duration seconds (600).
# On a machine with a package index, build the wheelhouse (the wheels the GPU host's python3
# lacks): `python -m benchmarks.device.wheelhouse` -> .wheelhouse/wheels.tar.xz. Copy the
# repository with .wheelhouse/ to the GPU host (it needs no package index) and run there
# from the copy:
#
#   bash benchmarks/device/gpu_soak.sh start [load/run.py args]   # returns after a minute
#   bash benchmarks/device/gpu_soak.sh status                     # any time: the log's tail
#   bash benchmarks/device/gpu_soak.sh collect                    # waits for the JSON
#
# `start` runs the soak in the background (setsid; ~13 min with the saturation phase) in
# $SOAK_DIR (/tmp/oq-gpu-soak); `collect` waits up to 3 min for its JSON, then copies
# gpu_soak.json, .log and .png to $OUT (./device-out unless set); exit status 3 while there
# is no result yet. `start --saturation-rps 1.1` skips the saturation phase with a figure
# measured before (2026-12-02: 1.100 jobs/s on an H200).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check
SOAK_DIR=${SOAK_DIR:-/tmp/oq-gpu-soak}
OUT=${OUT:-$PWD/device-out}
mode=${1:-start}
shift || true

case "$mode" in
start)
    # shellcheck source=benchmarks/device/venv.sh
    source benchmarks/device/venv.sh
    rm -rf "$SOAK_DIR"
    mkdir -p "$SOAK_DIR" "$OUT"
    PYTHONUNBUFFERED=1 "$VENV/bin/python" - "$SOAK_DIR" <<'PY'
import argparse, sys
from pathlib import Path
from benchmarks.gpu.common import save_wan
_, registry = save_wan(Path(sys.argv[1]), argparse.Namespace(layers=30))
print("registry", registry)
PY
    setsid nohup env PYTHONUNBUFFERED=1 "$VENV/bin/python" -m benchmarks.load.run \
        --workload benchmarks/load/workloads/wan_h200.toml --levels 0.9 --duration 600 \
        --env OMNIQ_MODEL_REGISTRY="$SOAK_DIR/models.toml" \
        --env OMNIQ_MODELS=wan-1.3b-random --env OMNIQ_WORKER__DEVICE=cuda \
        --env OMNIQ_WORKER__PREVIEW_EVERY=0 \
        --out "$SOAK_DIR/gpu_soak.json" --png "$SOAK_DIR/gpu_soak.png" "$@" \
        >"$SOAK_DIR/stdout" 2>"$SOAK_DIR/gpu_soak.log" </dev/null &
    echo "started pid $!; collect in ~13 min"
    sleep 60
    tail -5 "$SOAK_DIR/gpu_soak.log"
    ;;
status)
    tail -5 "$SOAK_DIR/gpu_soak.log"
    nvidia-smi --query-gpu=memory.used --format=csv || true
    ;;
collect)
    for _ in $(seq 60); do  # the run's last level settles, then up stops
        test -s "$SOAK_DIR/gpu_soak.json" && break
        sleep 3
    done
    mkdir -p "$OUT"
    cp "$SOAK_DIR"/gpu_soak.* "$OUT"/ 2>/dev/null || true
    tail -3 "$SOAK_DIR/gpu_soak.log"
    test -s "$SOAK_DIR/gpu_soak.json" || { echo "no result yet"; exit 3; }
    ;;
*)
    echo "usage: $0 start|status|collect [load/run.py args]" >&2
    exit 2
    ;;
esac
