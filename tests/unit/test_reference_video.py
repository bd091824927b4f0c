"""The procedural ``reference/video`` pipeline: sampler loop, determinism, output shape."""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import pytest

from tests.unit.job_steps import run_job
from tests.unit.reference_fixtures import loaded, video_request
from workers.pipelines.base import GenerationRequest, Media
from workers.pipelines.reference_video import (
    SAMPLE_RATE,
    ReferenceVideoPipeline,
    ReferenceVideoState,
)


def _run(request: GenerationRequest) -> Media:
    return run_job(loaded(ReferenceVideoPipeline), request)


def test_same_request_and_seed_is_bit_identical() -> None:
    a, b = _run(video_request()), _run(video_request())
    assert np.array_equal(a.frames, b.frames)
    assert a.audio is not None and b.audio is not None
    assert np.array_equal(a.audio, b.audio)


def test_different_seeds_differ() -> None:
    a, b = _run(video_request(seed=1)), _run(video_request(seed=2))
    assert np.abs(a.frames.astype(int) - b.frames.astype(int)).mean() > 1.0


def test_state_lives_in_the_state_object_not_on_the_pipeline() -> None:
    pipe = loaded(ReferenceVideoPipeline)
    first, second = pipe.prepare(video_request(seed=1)), pipe.prepare(video_request(seed=2))
    while not first.done:  # interleave two requests on one pipeline
        pipe.step(first)
        pipe.step(second)
    assert np.array_equal(pipe.decode(first).frames, _run(video_request(seed=1)).frames)
    assert np.array_equal(pipe.decode(second).frames, _run(video_request(seed=2)).frames)


def test_output_shapes_and_types() -> None:
    media = _run(video_request(width=80, height=32, num_frames=12, fps=30.0))
    assert media.frames.shape == (12, 32, 80, 3)
    assert media.frames.dtype == np.uint8
    assert media.fps == 30.0
    assert media.sample_rate == SAMPLE_RATE
    assert media.audio is not None
    assert media.audio.dtype == np.float32
    assert media.audio.shape == (2, round(12 / 30.0 * SAMPLE_RATE))


def test_steps_advance_one_at_a_time() -> None:
    pipe = loaded(ReferenceVideoPipeline)
    state = pipe.prepare(video_request(num_inference_steps=6))
    assert isinstance(state, ReferenceVideoState)
    assert state.num_steps == 6 and state.step_index == 0
    assert state.sigmas[0] == 1.0 and state.sigmas[-1] == 0.0 and len(state.sigmas) == 7
    distances = [float((state.latents - state.clean).abs().mean())]
    for expected in range(1, 7):
        pipe.step(state)
        assert state.step_index == expected
        distances.append(float((state.latents - state.clean).abs().mean()))
    assert state.done
    assert all(a > b for a, b in itertools.pairwise(distances))
    assert distances[-1] == 0.0
    with pytest.raises(RuntimeError):
        pipe.step(state)


def test_one_step_already_lands_on_the_clean_scene() -> None:
    one = _run(video_request(num_inference_steps=1))
    many = _run(video_request(num_inference_steps=12))
    assert one.frames.shape == (8, 48, 64, 3)
    assert np.array_equal(one.frames, many.frames)


def test_intermediate_state_is_blurrier_than_the_final_one() -> None:
    pipe = loaded(ReferenceVideoPipeline)
    state = pipe.prepare(video_request(width=128, height=96, num_inference_steps=10))
    pipe.step(state)
    early = pipe.preview(state)
    while not state.done:
        pipe.step(state)
    final = pipe.preview(state)

    def sharpness(img: np.ndarray) -> float:
        return float(np.abs(np.diff(img.astype(float), axis=1)).mean())

    assert early.shape == final.shape and early.dtype == np.uint8
    assert sharpness(early) < 0.5 * sharpness(final)


def test_preview_is_small() -> None:
    pipe = loaded(ReferenceVideoPipeline)
    state = pipe.prepare(video_request(width=640, height=360, num_frames=2, num_inference_steps=2))
    before = pipe.preview(state)
    pipe.step(state)
    after = pipe.preview(state)
    for img in (before, after):
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
        assert max(img.shape[:2]) <= 256


def test_frames_are_a_smooth_scene_not_noise() -> None:
    frames = _run(video_request(width=96, height=64, num_frames=12, fps=24.0)).frames.astype(float)
    noise = np.random.default_rng(0).integers(0, 256, frames.shape[1:]).astype(float)
    temporal = np.abs(np.diff(frames, axis=0)).mean()
    spatial = np.abs(np.diff(frames, axis=2)).mean()
    versus_noise = np.abs(frames[0] - noise).mean()
    assert temporal < 0.1 * versus_noise
    assert spatial < 0.1 * versus_noise
    assert temporal > 0.0  # something moves
    assert frames.std() > 20  # not a flat colour


def test_prompt_colours_are_visible() -> None:
    red = _run(video_request(prompt="a red ball", num_frames=1)).frames.astype(float)
    blue = _run(video_request(prompt="a blue ball", num_frames=1)).frames.astype(float)
    redness = lambda f: float((f[..., 0] - f[..., 2]).clip(0).sum())  # noqa: E731
    assert redness(red) > redness(blue)
    night = _run(video_request(prompt="a quiet night", num_frames=1)).frames
    day = _run(video_request(prompt="a sunny day", num_frames=1)).frames
    assert night.mean() < day.mean()


def test_reference_image_becomes_frame_zero() -> None:
    h, w = 48, 64
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=-1).clip(0, 255).astype(np.uint8)
    image[10:20, 10:30] = (250, 240, 10)
    image.setflags(write=False)  # callers may hand over read-only buffers
    media = _run(video_request(reference_image=image, num_frames=12))
    first = media.frames[0].astype(float)
    assert np.abs(first - image).mean() < 1.0
    assert np.abs(media.frames[-1].astype(float) - image).mean() > 2.0  # it evolves


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"motion": "fast"}, "motion"),
        ({"motion": -1.0}, "motion"),
        ({"motion": True}, "motion"),
        ({"camera": "dolly"}, "camera"),
        ({"camera": 3}, "camera"),
        ({"strength": 0.5}, "strength"),
    ],
)
def test_bad_extra_raises_naming_the_key(extra: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        loaded(ReferenceVideoPipeline).prepare(video_request(extra=extra))


@pytest.mark.parametrize("camera", ["static", "pan", "zoom"])
def test_cameras_and_motion(camera: str) -> None:
    moving = _run(video_request(extra={"camera": camera, "motion": 2.0}))
    frozen = _run(video_request(extra={"camera": camera, "motion": 0.0}))
    assert np.abs(np.diff(moving.frames.astype(float), axis=0)).mean() > 0.0
    assert np.array_equal(frozen.frames[0], frozen.frames[-1])


def test_guidance_scale_grades_saturation() -> None:
    plain = _run(video_request(num_frames=1)).frames.astype(float)
    vivid = _run(video_request(num_frames=1, guidance_scale=8.0)).frames.astype(float)
    spread = lambda f: float((f.max(axis=-1) - f.min(axis=-1)).mean())  # noqa: E731
    assert spread(vivid) > spread(plain)


def test_audio_is_audible_stereo_music_not_noise() -> None:
    media = _run(video_request(num_frames=16))
    audio = media.audio
    assert audio is not None
    assert np.abs(audio).max() <= 1.0
    assert np.sqrt((audio**2).mean()) > 0.05
    assert not np.array_equal(audio[0], audio[1])
    spectrum = np.abs(np.fft.rfft(audio[0])) ** 2
    top = np.sort(spectrum)[::-1][: len(spectrum) // 100]
    assert top.sum() > 0.5 * spectrum.sum()  # energy in few partials: tonal, not noise


def test_load_rejects_unknown_devices() -> None:
    pipe = ReferenceVideoPipeline()
    pipe.load("cpu")
    with pytest.raises(ValueError):
        pipe.load("tpu")


def test_small_request_is_fast() -> None:
    _run(video_request(width=64, height=64))  # warm-up
    start = time.perf_counter()
    _run(video_request(width=64, height=64, num_frames=8, num_inference_steps=4))
    assert time.perf_counter() - start < 1.0
