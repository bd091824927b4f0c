"""``ref2va``'s references in proportion to the work (issue 45 item 4).

Image references: diffusers' setup step encodes each at the pipeline's
``reference_image_short_edge`` (the released checkpoint's 2048, for its 768-pixel canvas,
upscaled and with no area cap). The tiny model had the released 2048 on its 64-pixel
canvas: the video VAE encoded 1,024 times the canvas's pixels a reference, 98 % of a
15.9 s prepare (docs/PERFORMANCE.md). It now encodes them in the released proportion.

Video references: handed to diffusers as the decoded ``(frames, height, width, 3)`` uint8
array, which its setup step normalises (24 fps, the job's frames, the canvas) exactly as the
list of PIL images it was handed before, without a PIL copy and a conversion of every frame
of the clip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
from PIL import Image

from models.catalog import FAMILY_SPECS
from tests.unit.h3_fixtures import h3_request, reference_short_edge, tiny_h3_pipe
from workers.pipelines.base import MediaReference
from workers.pipelines.diffusers.minimax_h3.adapter import MiniMaxH3Adapter
from workers.pipelines.diffusers.minimax_h3.inputs import to_h3_reference

CANVAS = 64


def test_the_tiny_model_encodes_image_references_in_the_released_proportion(
    tmp_path: Path,
) -> None:
    assert reference_short_edge(768) == 2048 and reference_short_edge(CANVAS) == 160
    pipe = tiny_h3_pipe(canvas_short_edge=CANVAS, canvas_max_pixels=CANVAS * CANVAS * 2)
    # saved as the queue's tests serve it: a worker loads the same geometry
    pipe.save_pretrained(str(tmp_path), overwrite_modular_index=True)
    saved = json.loads((tmp_path / "modular_model_index.json").read_text())
    assert saved["reference_image_short_edge"] == 160
    spec = FAMILY_SPECS["diffusers.minimax_h3"].model_copy(update={"workflows": ["ref2va"]})
    adapter = MiniMaxH3Adapter(pipe=pipe, spec=spec)
    adapter.load("cpu")
    picture = np.random.default_rng(0).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
    state = adapter.prepare(h3_request(references=[MediaReference("image", frames=picture)]))
    # 160 pixels over the VAE's 16: a 10x10 latent (128x128 at 2048)
    assert state.pipeline_state.get("condition_latents")[0].shape[-2:] == (10, 10)
    adapter.end()


def _clip(count: int, height: int = 36, width: int = 64) -> np.ndarray:
    return np.random.default_rng(count).integers(0, 256, (count, height, width, 3), np.uint8)


@pytest.mark.parametrize(("count", "fps"), [(90, 30.0), (40, 15.0), (130, 24.0), (30, 29.97)])
def test_a_video_reference_is_one_array_normalised_as_its_frames_were(
    count: int, fps: float
) -> None:
    frames = _clip(count)
    ref = MediaReference("video", frames=frames, fps=fps)
    video = to_h3_reference(ref)
    assert isinstance(video.frames, np.ndarray) and video.frames.dtype == np.uint8
    # diffusers' own normalisation (24 fps, 124 frames at most, the canvas of the clip's
    # own ratio) of what was handed over before: a PIL image per frame
    normalise = MiniMaxH3Ref2VASetupStep._normalize_video_condition
    geometry = (124, 32, CANVAS, CANVAS * CANVAS * 2, 24.0)
    before = normalise([Image.fromarray(f) for f in frames], fps, *geometry)
    assert np.array_equal(normalise(video.frames, float(video.fps), *geometry), before)
