#!/usr/bin/env bash
# Sourced by the benchmarks/device/gpu_*.sh scripts from the repository root:
# `run_bench PKG.NAME [args]` runs `python -m benchmarks.PKG.NAME` on the lent GPU machine in
# the wheelhouse's venv (venv.sh), its JSON to $OUT/PKG_NAME.json and its stderr to
# $OUT/PKG_NAME.log (and the terminal). With BENCH_TIMEOUT_S set, the script is killed
# (SIGTERM, SIGKILL 10 s later) after that long.
run_bench() {
    local module=$1
    local name=${module//./_}
    shift
    OUT=${OUT:-$PWD/device-out}
    mkdir -p "$OUT"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
    # shellcheck source=benchmarks/device/venv.sh
    source benchmarks/device/venv.sh
    local t0
    t0=$(date +%s)
    local limit=()
    if [ -n "${BENCH_TIMEOUT_S:-}" ]; then
        limit=(timeout --kill-after=10 "$BENCH_TIMEOUT_S")
    fi
    PYTHONUNBUFFERED=1 OUT="$OUT" "${limit[@]}" "$VENV/bin/python" -m "benchmarks.$module" "$@" \
        >/dev/null \
        2> >(tee "$OUT/$name.log" >&2)
    echo "benchmark_s: $(($(date +%s) - t0))"
}

# `summary NAME KEY...`: the top-level KEYs of $OUT/NAME.json, as one dict.
summary() {
    local name=$1
    shift
    "$VENV/bin/python" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print({k: d.get(k) for k in sys.argv[2:]})' "$OUT/$name.json" "$@"
}
