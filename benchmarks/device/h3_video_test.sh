#!/usr/bin/env bash
# MiniMax-H3 ref2va with a video reference (tests/unit/test_h3_video_reference.py) where
# torchvision is: the lent GPU machine's image (torch + torchvision), run on its CPU.
# CI cannot run it: PyPI's torchvision does not import beside the CPU torch wheel.
#
#   run(command="bash benchmarks/device/h3_video_test.sh", carry=[".wheelhouse/h3"])
#
# The wheelhouse's diffusers 0.42.1 and the service's packages go to /tmp/h3-video-site
# with --no-deps over the image's own torch, torchvision, transformers, peft and pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=/tmp/h3-video-site
python3 -c "import torchvision, pytest, peft; print('torchvision', torchvision.__version__)"
if [ ! -f "$SITE/.installed" ]; then
    rm -rf /tmp/h3-video-wheels "$SITE" && mkdir -p /tmp/h3-video-wheels
    tar -C /tmp/h3-video-wheels -xJf .wheelhouse/h3/wheels.tar.xz
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
        /tmp/h3-video-wheels/*.whl
    touch "$SITE/.installed"
fi
PYTHONPATH="$SITE:$PWD" CUDA_VISIBLE_DEVICES= python3 -m pytest -q -p no:cacheprovider \
    -o addopts= tests/unit/test_h3_video_reference.py
