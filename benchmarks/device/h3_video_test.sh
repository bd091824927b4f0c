#!/usr/bin/env bash
# MiniMax-H3 ref2va with a video reference (tests/unit/test_h3_video_reference.py) where
# torchvision is: a GPU host whose python3 has torch, torchvision, transformers, peft and
# pytest (the test runs on its CPU; a GPU is printed where there is one, not needed).
# CI cannot run it: PyPI's torchvision does not import beside the CPU torch wheel.
#
# On a machine with a package index: `python -m benchmarks.device.wheelhouse` and
# `bash benchmarks/device/h3.sh --pack` (-> .wheelhouse/h3/). Copy the repository with
# .wheelhouse/h3/ to the host and run there from the copy:
#   bash benchmarks/device/h3_video_test.sh
#
# The wheelhouse's diffusers 0.42.1 and the service's packages go to /tmp/h3-video-site
# with --no-deps over the host's own torch, torchvision, transformers, peft and pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/device/preflight.sh
source benchmarks/device/preflight.sh
gpu_check --optional
SITE=/tmp/h3-video-site
python3 -c "import torchvision, pytest, peft; print('torchvision', torchvision.__version__)" ||
    { echo "h3_video_test.sh: this host's python3 lacks torchvision, pytest or peft" >&2; exit 2; }
if [ ! -f "$SITE/.installed" ]; then
    need .wheelhouse/h3/wheels.tar.xz
    rm -rf /tmp/h3-video-wheels "$SITE" && mkdir -p /tmp/h3-video-wheels
    tar -C /tmp/h3-video-wheels -xJf .wheelhouse/h3/wheels.tar.xz
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
        /tmp/h3-video-wheels/*.whl
    touch "$SITE/.installed"
fi
PYTHONPATH="$SITE:$PWD" CUDA_VISIBLE_DEVICES='' python3 -m pytest -q -p no:cacheprovider \
    -o addopts= tests/unit/test_h3_video_reference.py
