#!/usr/bin/env bash
# Sourced by the benchmarks/device/*.sh scripts from the repository root on the GPU host:
# `run_bench PKG.NAME [args]` runs `python -m benchmarks.PKG.NAME` in the wheelhouse's venv
# (venv.sh), its JSON to $OUT/PKG_NAME.json and its stderr to $OUT/PKG_NAME.log (and the
# terminal); OUT defaults to ./device-out. With BENCH_TIMEOUT_S set, the benchmark is killed
# (SIGTERM, SIGKILL 10 s later) after that long. The scripts print the GPU first
# (preflight.sh's gpu_check).
run_bench() {
    local module=$1
    shift
    OUT=${OUT:-$PWD/device-out}
    mkdir -p "$OUT"
    # shellcheck source=benchmarks/device/venv.sh
    source benchmarks/device/venv.sh
    bench_with "$VENV/bin/python" "$OUT/${module//./_}.log" "$module" "$@"
}

# `bench_with PYTHON LOG PKG.NAME [args]`: `PYTHON -m benchmarks.PKG.NAME` (the scripts that
# run in process over a site directory pass python3), its stdout dropped (its JSON goes to
# $OUT), its stderr to LOG and the terminal, then `benchmark_s`; BENCH_TIMEOUT_S as above.
bench_with() {
    local python=$1 log=$2 module=$3
    shift 3
    local t0
    t0=$(date +%s)
    local limit=()
    if [ -n "${BENCH_TIMEOUT_S:-}" ]; then
        limit=(timeout --kill-after=10 "$BENCH_TIMEOUT_S")
    fi
    PYTHONUNBUFFERED=1 OUT="$OUT" "${limit[@]}" "$python" -m "benchmarks.$module" "$@" \
        >/dev/null \
        2> >(tee "$log" >&2)
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
