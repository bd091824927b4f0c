#!/usr/bin/env bash
# Sourced first by the benchmarks/device/*.sh scripts, on the GPU host:
#   gpu_check [--optional]  prints the GPU(s) the run is on ("gpu: 0, NVIDIA H100 80GB HBM3,
#                           81559 MiB"); with none, one line on stderr and exit 2
#                           (--optional: "gpu: none" and go on, for a script that runs on
#                           the host's CPU)
#   need FILE [HINT]        one line on stderr and exit 2 when FILE is missing (the
#                           wheelhouse, mostly; HINT says how to make it)
#   site_install DIR TARBALL [TAR ...]
#                           the wheels of TARBALL (a wheelhouse half) installed --no-deps
#                           into DIR over the host's packages, then each TAR that exists
#                           unpacked into DIR; once (DIR/.installed marks it done)
# nvidia-smi answers first; torch.cuda where there is no nvidia-smi.

WHEELHOUSE_HINT="build it on a machine with a package index: python -m benchmarks.device.wheelhouse"
WHEELHOUSE_HINT+=" (and bash benchmarks/device/h3.sh --pack for .wheelhouse/h3 and .wheelhouse/servers),"
WHEELHOUSE_HINT+=" then copy .wheelhouse/ into the repository here"

gpu_check() {
    local gpus=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        gpus=$(nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null) ||
            gpus=""
    fi
    if [ -z "$gpus" ]; then
        gpus=$("${PYTHON:-python3}" -c 'import torch
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"{i}, {p.name}, {p.total_memory >> 20} MiB")' 2>/dev/null) || gpus=""
    fi
    if [ -z "$gpus" ]; then
        if [ "${1:-}" = --optional ]; then
            echo "gpu: none"
            return 0
        fi
        echo "$(basename "$0"): no GPU on this host (nvidia-smi and torch.cuda see none)" >&2
        exit 2
    fi
    printf '%s\n' "$gpus" | sed 's/^/gpu: /'
}

need() {
    if [ ! -e "$1" ]; then
        echo "$(basename "$0"): missing $1: ${2:-$WHEELHOUSE_HINT}" >&2
        exit 2
    fi
}

site_install() {
    local site=$1 tarball=$2 wheels=$1-wheels extra
    [ -f "$site/.installed" ] && return 0
    need "$tarball"
    rm -rf "$wheels" "$site" && mkdir -p "$wheels"
    tar -C "$wheels" -xJf "$tarball"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl
    for extra in "${@:3}"; do
        if [ -f "$extra" ]; then tar -C "$site" -xJf "$extra"; fi
    done
    touch "$site/.installed"
}
