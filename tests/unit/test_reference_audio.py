"""``reference/audio``: a deterministic, step-executed flow-matching sampler."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from tests.unit.job_steps import run_job
from tests.unit.reference_fixtures import loaded
from workers.pipelines.base import GenerationRequest
from workers.pipelines.reference_audio import (
    POOL,
    SAMPLE_RATE,
    ReferenceAudioPipeline,
    compose,
)


def _request(**kw: Any) -> GenerationRequest:
    base: dict[str, Any] = {
        "prompt": "rain on a dark night with drums",
        "duration_s": 1.5,
        "num_inference_steps": 6,
        "seed": 7,
    }
    return GenerationRequest.audio(**base | kw)


@pytest.fixture()
def pipe() -> ReferenceAudioPipeline:
    return loaded(ReferenceAudioPipeline)


def test_same_request_same_audio_and_it_is_the_target(pipe: ReferenceAudioPipeline) -> None:
    a, b = run_job(pipe, _request()), run_job(pipe, _request())
    assert a.audio is not None and b.audio is not None
    assert a.audio.shape == (2, 36_000) and a.audio.dtype == np.float32
    assert a.sample_rate == SAMPLE_RATE and a.frames.shape[0] == 0
    assert np.array_equal(a.audio, b.audio)
    target = compose(_request(), 36_000).astype(np.float32)
    assert np.array_equal(a.audio, target)
    assert 0.69 < np.abs(a.audio).max() <= 0.7


def test_seed_prompt_and_options_change_the_audio(pipe: ReferenceAudioPipeline) -> None:
    base = run_job(pipe, _request()).audio
    for changed in (
        _request(seed=8),
        _request(prompt="a bright sunny morning"),
        _request(options={"voice": "alloy"}),
        _request(options={"speed": 2.0}),
        _request(options={"guidance_scale": 15.0}),
        _request(negative_prompt="drums"),
        _request(extra={"bpm": 200.0}),
    ):
        assert not np.array_equal(run_job(pipe, changed).audio, base), changed


def test_each_step_moves_from_noise_toward_the_target(pipe: ReferenceAudioPipeline) -> None:
    state = pipe.prepare(_request(num_inference_steps=8))
    distances = [float(np.abs(state.latents - state.clean).mean())]
    while not state.done:
        pipe.step(state)
        distances.append(float(np.abs(state.latents - state.clean).mean()))
    assert all(b < a for a, b in itertools.pairwise(distances))
    assert distances[-1] == 0.0
    assert state.latents.shape == (2, 36_000 // POOL)
    with pytest.raises(RuntimeError):
        pipe.step(state)


def test_one_step_lands_on_the_target_and_an_early_stop_is_noisy(
    pipe: ReferenceAudioPipeline,
) -> None:
    one = run_job(pipe, _request(num_inference_steps=1)).audio
    assert np.array_equal(one, run_job(pipe, _request(num_inference_steps=30)).audio)
    state = pipe.prepare(_request())
    pipe.step(state)
    early = pipe.decode(state).audio
    assert early is not None and not np.array_equal(early, one)


def test_length_follows_the_request_and_bad_extras_are_refused(
    pipe: ReferenceAudioPipeline,
) -> None:
    media = run_job(pipe, _request(duration_s=0.25, num_inference_steps=2))
    assert media.audio is not None and media.audio.shape == (2, 6000)
    with pytest.raises(ValueError, match="bogus"):
        pipe.prepare(_request(extra={"bogus": 1}))
