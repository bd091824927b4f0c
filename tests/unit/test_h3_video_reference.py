"""MiniMax-H3 ``ref2va`` with a **video** reference and its soundtrack, step-executed,
bit-equal to diffusers' modular pipeline call (issue 30 §1).

transformers' Qwen3-VL video processor needs torchvision, and PyPI's torchvision does not
import beside the CPU torch wheel the CI installs, so CI skips this module (said in its
``-ra`` summary). It runs where torchvision is: a GPU worker's image, or on this machine in
a venv of ``torch==2.14.1 torchvision==0.29.1`` (CUDA builds, CPU run)::

    python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/tvenv/bin/pip install -e '.[dev]'
    /tmp/tvenv/bin/python -m pytest -q tests/unit/test_h3_video_reference.py

or on the lent GPU machine, whose image has torchvision (CPU run; passed there at
``1a40a19`` on 2026-12-04: torch 2.11.0, torchvision 0.26.0, diffusers 0.42.1)::

    bash benchmarks/device/h3_video_test.sh      # carry .wheelhouse/h3

Without torchvision a worker refuses a video reference by name instead
(``test_minimax_h3.py``: ``h3_processor.ImageOnlyProcessor``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torchvision", reason="Qwen3-VL's video processor needs torchvision")

from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor

from models.catalog import FAMILY_SPECS
from tests.unit.h3_fixtures import h3_request, tiny_h3_pipe
from tests.unit.job_steps import run_job
from workers.pipelines.base import MediaReference
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.inputs import call_inputs
from workers.pipelines.diffusers.minimax_h3.processor import takes_video
from workers.pipelines.diffusers.shared.common import make_generator, to_uint8


def _pipe() -> Any:
    pipe = tiny_h3_pipe(canvas_short_edge=64, canvas_max_pixels=8192)
    video = Qwen3VLVideoProcessor(
        patch_size=4,
        temporal_patch_size=2,
        merge_size=2,
        size={"shortest_edge": 16 * 16, "longest_edge": 64 * 64 * 64},
    )
    images = pipe.processor.image_processor
    full = Qwen3VLProcessor(
        image_processor=images, tokenizer=pipe.processor.tokenizer, video_processor=video
    )
    pipe.update_components(processor=full)
    return pipe


def _clip(seconds: float = 2.0, fps: float = 24.0, seed: int = 5) -> MediaReference:
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (int(seconds * fps), 64, 64, 3), dtype=np.uint8)
    t = np.arange(int(seconds * 32000)) / 32000
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)[None].repeat(2, 0)
    return MediaReference(kind="video", frames=frames, fps=fps, audio=tone, sample_rate=32000)


@pytest.mark.parametrize("with_image", [False, True])
def test_ref2va_with_a_video_and_its_soundtrack_is_bit_equal(with_image: bool) -> None:
    pipe = _pipe()
    assert takes_video(pipe.processor)
    spec = FAMILY_SPECS["diffusers.minimax_h3"].model_copy(update={"workflows": ["ref2va"]})
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=spec)
    adapter.load("cpu")
    refs = [_clip()]
    if with_image:
        image = np.random.default_rng(6).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        refs.insert(0, MediaReference(kind="image", frames=image))
    request = h3_request(references=refs)
    media = run_job(adapter, request)
    out = pipe(**call_inputs(request, make_generator(request.seed), 32000), output_type="np")
    assert np.array_equal(media.frames, to_uint8(np.asarray(out.get("videos")[0])))
    assert np.array_equal(media.audio, out.get("audio")[0].float().numpy())
    if not with_image:  # the video's content reaches the result
        other = run_job(adapter, h3_request(references=[_clip(seed=7)]))
        assert not np.array_equal(other.frames, media.frames)
