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
# realtime workers) in the same venv. More arguments go to benchmarks/gpu/world.py, e.g.
# --quantization fp8 (FP8 weights in every part, issue 44) or --attention cudnn (cuDNN's
# fused attention in every part: the raw pipeline's and both entries'), or
# --vae-channels-last (the VAE decoder's weights channels-last in every part: the raw
# pipeline's and both entries' adapter option vae_channels_last), given to each of
# the three, or --worker-env KEY=VALUE (repeatable: the stack's and the takeover's worker
# settings). Each part writes $OUT/gpu_world.json (gpu_world_fp8.json with --quantization
# fp8, gpu_world[_fp8]_cudnn.json with --attention cudnn, then _cl with
# --vae-channels-last: gpu_world_fp8_cl.json) with
# every key measured so far (the parts' keys are carried in /tmp/world-state.json, one
# file per mode), $OUT/gpu_world[_fp8]_<part>.log and up's log of its part (OUT:
# ./device-out unless set); the last part's JSON is the evidence: copy it to docs/evidence/.
#
# What a session leaves on the device (issue 43 §3), in process (benchmarks/gpu/world_memory.py,
# no servers; after --raw, which installs what it needs):
#   bash benchmarks/device/world.sh --memory [world_memory.py args]
# JSON to $OUT/gpu_world_memory.json, its log to $OUT/gpu_world_memory.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
if [ "${1:-}" = "--pack" ]; then
    exec bash benchmarks/device/h3.sh --pack
fi
ALL=/tmp/world-wheels-all
SITE=/tmp/world-site
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
part=${1:-}
shift || true
case "$part" in
--raw | --stack | --takeover | --memory) gpu_check ;;
esac
mode=""  # the run's files are the mode's own: --quantization fp8 -> _fp8, then
case " $* " in  # --attention cudnn -> _cudnn (plans.mode_suffix's names)
*" --quantization fp8 "* | *" --quantization=fp8 "*) mode=_fp8 ;;
esac
case " $* " in
*" --attention cudnn "* | *" --attention=cudnn "*) mode=${mode}_cudnn ;;
esac
case " $* " in  # then --vae-channels-last -> _cl
*" --vae-channels-last "*) mode=${mode}_cl ;;
esac
STATE=/tmp/world-state$mode.json

world_summary() {
    "$1" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({k: (v["value"], v["pass"]) for k, v in d["targets"].items()}, indent=1))
keys = ("quantization", "attention", "vae_channels_last", "part_seconds", "raw_refused", "stack_error", "takeover_note",
        "takeover_memory_after_load_mib", "compile_fallbacks", "up_exit_code", "worker_env")
print({k: d.get(k) for k in keys})' "$OUT/gpu_world$mode.json"
}

raw_site() {  # the first half's wheels over the host's packages, for the in-process parts
    need .wheelhouse/h3/wheels.tar.xz
    rm -rf "$ALL" && mkdir -p "$ALL"
    tar -C "$ALL" -xJf .wheelhouse/h3/wheels.tar.xz
    if [ ! -f "$SITE/.installed" ]; then
        rm -rf "$SITE"
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$ALL"/*.whl
        touch "$SITE/.installed"
    fi
    export PYTHONPATH="$SITE:$PWD"
}

case "$part" in
--raw)
    raw_site
    rm -f "$STATE"
    PY=python3
    ;;
--memory)
    [ -f "$SITE/.installed" ] || raw_site
    export PYTHONPATH="$SITE:$PWD"
    bench_with python3 "$OUT/gpu_world_memory$mode.log" gpu.world_memory "$@"
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print({k: d.get(k) for k in ("gpu", "quantization", "attention", "error", "baseline_mib",
                              "notes")})
for name, p in d.get("phases", {}).items():
    live = p.get("live", {})
    print(name, {k: p.get(k) for k in ("seconds", "allocated_mib", "allocated_full_gc_mib",
          "delta_mib", "vae_feat_map_tensors")},
          {k: live.get(k) for k in ("new_tensors", "new_mib", "unaccounted_mib")})' \
        "$OUT/gpu_world_memory$mode.json"
    exit 0
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
    echo "usage: world.sh --pack | --raw | --stack | --takeover | --memory [args]" >&2
    exit 2
    ;;
esac
name=${part#--}
bench_with "$PY" "$OUT/gpu_world${mode}_$name.log" gpu.world --part "$name" --state "$STATE" \
    --keep-logs "$OUT" "$@"
world_summary "$PY"
