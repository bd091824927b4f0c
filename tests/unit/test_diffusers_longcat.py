"""The LongCat-AudioDiT text-to-speech adapter against ``LongCatAudioDiTPipeline.__call__``.

A tiny random-weight pipeline (``longcat_fixtures``), CPU, float32, offline. Every
comparison is exact (``torch.equal``, tolerance 0): the adapter with ``guidance_batch =
false`` (the reference the docs promise) calls the same modules with the same inputs in
the same order as ``__call__`` (the conditional pass, then the null pass, the guidance in
``__call__``'s own arithmetic, the same scheduler class on a copy, the noise drawn from a
CPU generator of the same seed). The default, one pass of both rows a step, is compared
with it in ``test_longcat_batch.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from diffusers.pipelines.longcat_audio_dit.pipeline_longcat_audio_dit import (
    _approx_duration_from_text,
)

from api.audio_validation import resolve_audio, resolve_speech
from models.audio import AudioCreate, SpeechCreate
from models.catalog import FAMILY_SPECS
from models.errors import InvalidJobInput, InvalidRequest
from storage.settings import Settings
from tests.unit.longcat_fixtures import tiny_longcat_pipeline
from workers.pipelines.base import GenerationRequest, Media
from workers.pipelines.diffusers.longcat_audio.adapter import LongCatAudioAdapter
from workers.pipelines.diffusers.longcat_audio.random_weights import TINY_CONFIG

SPEC = FAMILY_SPECS["diffusers.longcat_audio"]
TEXT = "Hello there, friend."
LONGER = TEXT + " The trains run on time today."


def _request(prompt: str = TEXT, **kw: Any) -> GenerationRequest:
    base: dict[str, Any] = dict(
        prompt=prompt, duration_s=5.0, num_inference_steps=3, seed=7, guidance_scale=4.0
    )
    return GenerationRequest.audio(**(base | kw))


def _reference(pipe: Any, req: GenerationRequest, seconds: float | None = None) -> torch.Tensor:
    out = pipe(
        req.prompt,
        negative_prompt=req.negative_prompt or None,
        audio_duration_s=seconds,
        num_inference_steps=req.num_inference_steps,
        guidance_scale=req.guidance_scale,
        generator=torch.Generator().manual_seed(req.seed),
        output_type="pt",
    )
    audio: torch.Tensor = out.audios[0]
    return audio


def _run(adapter: LongCatAudioAdapter, req: GenerationRequest) -> Media:
    state = adapter.prepare(req)
    while not state.done:
        adapter.step(state)
    return adapter.decode(state)


def _audio(media: Media) -> torch.Tensor:
    assert media.frames.shape == (0, 0, 0, 3)
    assert media.audio is not None and media.audio.dtype == np.float32
    assert media.sample_rate == 8000  # TINY_CONFIG's
    return torch.from_numpy(media.audio)


@pytest.fixture(scope="module")
def pipe() -> Any:
    return tiny_longcat_pipeline()


@pytest.fixture()
def longcat(pipe: Any) -> LongCatAudioAdapter:
    """``__call__``'s two passes a step (``guidance_batch = false``)."""
    adapter = LongCatAudioAdapter(pipe=pipe, guidance_batch=False)
    adapter.load("cpu")
    return adapter


@pytest.mark.parametrize(
    ("guidance_scale", "negative_prompt"),
    [(4.0, None), (1.0, None), (3.0, "robotic, muffled")],
    ids=["cfg", "no-cfg", "negative-prompt"],
)
def test_equals_pipeline(
    longcat: LongCatAudioAdapter, pipe: Any, guidance_scale: float, negative_prompt: str | None
) -> None:
    """Text → duration → steps → VAE: bit-equal to ``__call__`` without a duration."""
    req = _request(guidance_scale=guidance_scale, negative_prompt=negative_prompt)
    before = copy.deepcopy(vars(pipe.scheduler))
    audio = _audio(_run(longcat, req))
    # The job ran on its own scheduler: the shared one is as it was (then __call__ uses it).
    after = vars(pipe.scheduler)
    assert after.keys() == before.keys()
    for key, value in after.items():
        same = torch.equal(value, before[key]) if isinstance(value, torch.Tensor) else None
        assert same if same is not None else value == before[key], key
    assert torch.equal(audio, _reference(pipe, req))
    assert audio.abs().max() > 0 and torch.isfinite(audio).all()


def test_default_guidance_is_the_pipelines(longcat: LongCatAudioAdapter, pipe: Any) -> None:
    """No ``guidance_scale``: ``__call__``'s default (4.0)."""
    req = GenerationRequest.audio(prompt=TEXT, duration_s=5.0, num_inference_steps=2, seed=1)
    assert torch.equal(
        _audio(_run(longcat, req)), _reference(pipe, _request(num_inference_steps=2, seed=1))
    )


def test_duration_follows_the_text(longcat: LongCatAudioAdapter, pipe: Any) -> None:
    """The clip is ``__call__``'s estimate from the text, whatever ``duration_s`` (the
    API's word count) says; more text, a longer clip."""
    ratio = pipe.vae_scale_factor
    lengths = []
    for text in (TEXT, LONGER):
        audio = _audio(_run(longcat, _request(prompt=text, duration_s=1.0, num_inference_steps=1)))
        frames = int(_approx_duration_from_text(text.lower()) * pipe.sample_rate // ratio)
        assert audio.shape == (1, frames * ratio)
        lengths.append(audio.shape[1])
    assert lengths[1] > 2 * lengths[0]


def test_speed_stretches_the_estimate(longcat: LongCatAudioAdapter, pipe: Any) -> None:
    """``speed`` s: ``__call__`` with ``audio_duration_s = estimate / s``."""
    estimate = _approx_duration_from_text(TEXT.lower())
    lengths = {}
    for speed in (0.5, 2.0):
        req = _request(options={"speed": speed})
        audio = _audio(_run(longcat, req))
        assert torch.equal(audio, _reference(pipe, req, seconds=estimate / speed))
        lengths[speed] = audio.shape[1]
    assert lengths[0.5] > 3 * lengths[2.0]


def test_a_given_length_replaces_the_estimate(longcat: LongCatAudioAdapter, pipe: Any) -> None:
    """``duration_seconds`` (speech) / ``seconds`` (generations) is ``audio_duration_s``."""
    req = _request(options={"speed": 1.0, "duration_seconds": 0.9})
    audio = _audio(_run(longcat, req))
    assert torch.equal(audio, _reference(pipe, req, seconds=0.9))
    assert audio.shape[1] == int(0.9 * 8000 // 256) * 256


def test_refusals_name_their_field(longcat: LongCatAudioAdapter) -> None:
    with pytest.raises(InvalidJobInput) as speed:
        longcat.prepare(_request(options={"speed": 2.0, "duration_seconds": 3.0}))
    assert speed.value.param == "speed"
    reference = GenerationRequest(_request().spec, reference_image=np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(InvalidJobInput, match="input_reference"):
        longcat.prepare(reference)


def test_interleaved_jobs(longcat: LongCatAudioAdapter, pipe: Any) -> None:
    """Two jobs stepped alternately on one adapter: each is its own ``__call__``."""
    a, b = _request(seed=1), _request(prompt=LONGER, seed=2, guidance_scale=2.0)
    sa, sb = longcat.prepare(a), longcat.prepare(b)
    while not (sa.done and sb.done):
        for s in (sa, sb):
            if not s.done:
                longcat.step(s)
    assert torch.equal(_audio(longcat.decode(sa)), _reference(pipe, a))
    assert torch.equal(_audio(longcat.decode(sb)), _reference(pipe, b))


def test_random_weights_mode_builds_the_pipeline() -> None:
    """``weights = "random"``: the pipeline from configs on the device (here the tiny
    override; unknown parts are refused)."""
    adapter = LongCatAudioAdapter(random_weights=True, dtype="float32", random_config=TINY_CONFIG)
    adapter.load("cpu")
    assert adapter.pipe.transformer.config.dit_dim == 32
    assert _audio(_run(adapter, _request(num_inference_steps=1))).shape[1] > 0
    bad = LongCatAudioAdapter(random_weights=True, random_config={"unet": {}})
    with pytest.raises(ValueError, match="random_config: no part unet"):
        bad.load("cpu")


def test_speech_hands_longcat_its_fields() -> None:
    """``/v1/audio/speech``: the default speaker is LongCat; ``speed`` reaches it,
    ``duration_seconds`` only when the client gave one; ``voice`` does not (no speaker)."""
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    specs = {"other/audio": FAMILY_SPECS["diffusers.stable_audio"], "longcat": SPEC}
    plain = resolve_speech(SpeechCreate(input=TEXT, voice="nova", speed=1.5), specs, settings)
    assert plain.model == "longcat"
    assert plain.options == {"speed": 1.5}
    timed = resolve_speech(SpeechCreate(input=TEXT, duration_seconds=2.5), specs, settings)
    assert timed.options == {"speed": 1.0, "duration_seconds": 2.5}
    generated = resolve_audio(AudioCreate(prompt=TEXT, model="longcat", seconds=4), specs, settings)
    assert generated.options == {"duration_seconds": 4.0}
    with pytest.raises(InvalidRequest) as too_long:
        resolve_speech(SpeechCreate(input=TEXT, duration_seconds=31), specs, settings)
    assert too_long.value.param == "duration_seconds"
