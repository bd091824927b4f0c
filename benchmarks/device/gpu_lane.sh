#!/usr/bin/env bash
# benchmarks/gpu/lane.py on a GPU host: compiled blocks, cache tiers, LoRA and the compiled
# stack on one GPU.
# On a machine with a package index, build the wheelhouse (the wheels the GPU host's python3
# lacks): `python -m benchmarks.device.wheelhouse` -> .wheelhouse/wheels.tar.xz. Copy the
# repository with .wheelhouse/ to the GPU host (it needs no package index) and run there
# from the copy:
#   bash benchmarks/device/gpu_lane.sh [gpu/lane.py args]
# JSON to $OUT/gpu_lane.json, stderr to $OUT/gpu_lane.log (OUT: ./device-out unless set).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
run_bench gpu.lane "$@"
summary gpu_lane gpu compiled_step_ratio recompiles_second_job compile_warmup_s \
    cancel_p95_ms_compiled block_ms tier_denoise_ratio_high tier_denoise_ratio_fast \
    lora_swap_ms_p95 lora_recompiles full_stack_wall_over_raw_compiled compile_failed
summary gpu_lane eager compiled tiers lora_memory raw_wall_s stack_cancel_ms
