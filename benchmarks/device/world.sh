#!/usr/bin/env bash
# Helios world video over WS /v1/realtime/video on a GPU host (issue 31's evidence:
# benchmarks/gpu/world.py; the 14 B random-weight Helios-Distilled built on the GPU).
#
# On a machine with a package index, once: the wheelhouse split in two, as for H3 (each half
# stays under 64 MiB with the tracked tree, for a host that limits what is copied):
#   python -m benchmarks.device.wheelhouse              # .wheelhouse/wheels.tar.xz
#   bash benchmarks/device/world.sh --pack              # = h3.sh --pack:
#                                                       #   .wheelhouse/h3/, .wheelhouse/servers/
# Copy the repository with .wheelhouse/ to the GPU host (it needs no package index) and run
# there from the copy, the three parts in a row:
#   bash benchmarks/device/world.sh --raw
#   bash benchmarks/device/world.sh --stack
#   bash benchmarks/device/world.sh --takeover
# --raw unpacks .wheelhouse/h3 to /tmp/world-wheels-all and installs it --no-deps over the
# host's packages (/tmp/world-site), then runs the raw part in process (no servers needed);
# --stack adds .wheelhouse/servers and the venv of benchmarks/device/venv.sh, then runs the
# stack part (omniqueue up, one realtime worker); --takeover runs the takeover part (two
# realtime workers) in the same venv. More arguments go to benchmarks/gpu/world.py.
# Each part writes $OUT/gpu_world.json with every key measured so far (the parts' keys are
# carried in /tmp/world-state.json), $OUT/gpu_world_<part>.log and up's log of its part
# (OUT: ./device-out unless set); the last part's gpu_world.json is the evidence: copy it to
# docs/evidence/.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
if [ "${1:-}" = "--pack" ]; then
    exec bash benchmarks/device/h3.sh --pack
fi
ALL=/tmp/world-wheels-all
STATE=/tmp/world-state.json
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
part=${1:-}
shift || true
case "$part" in
--raw | --stack | --takeover) gpu_check ;;
esac

summary() {
    "$1" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({k: (v["value"], v["pass"]) for k, v in d["targets"].items()}, indent=1))
print({k: d.get(k) for k in ("part_seconds", "takeover_note", "up_exit_code")})' \
        "$OUT/gpu_world.json"
}

case "$part" in
--raw)
    need .wheelhouse/h3/wheels.tar.xz
    rm -rf "$ALL" "$STATE" && mkdir -p "$ALL"
    tar -C "$ALL" -xJf .wheelhouse/h3/wheels.tar.xz
    SITE=/tmp/world-site
    if [ ! -f "$SITE/.installed" ]; then
        rm -rf "$SITE"
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$ALL"/*.whl
        touch "$SITE/.installed"
    fi
    export PYTHONPATH="$SITE:$PWD"
    PY=python3
    ;;
--stack | --takeover)
    [ -d "$ALL" ] || { echo "run --raw first (with .wheelhouse/h3)" >&2; exit 2; }
    if [ "$part" = --stack ]; then
        need .wheelhouse/servers/wheels.tar.xz
        tar -C "$ALL" -xJf .wheelhouse/servers/wheels.tar.xz
    fi
    WHEELHOUSE=$ALL
    # shellcheck source=benchmarks/device/venv.sh
    source benchmarks/device/venv.sh
    PY="$VENV/bin/python"
    ;;
*)
    echo "usage: world.sh --pack | --raw | --stack | --takeover [world.py args]" >&2
    exit 2
    ;;
esac
name=${part#--}
t0=$(date +%s)
PYTHONUNBUFFERED=1 OUT="$OUT" "$PY" -m benchmarks.gpu.world --part "$name" --state "$STATE" \
    --keep-logs "$OUT" "$@" >/dev/null 2> >(tee "$OUT/gpu_world_$name.log" >&2)
echo "benchmark_s: $(($(date +%s) - t0))"
summary "$PY"
