"""The job spec contract: what the API builds from a request is what the worker runs.

Each test goes the whole way a spec travels: validated request → spec (API) → job row
(``Job.new``) → JSON (what the database stores) → parsed spec and adapter request
(worker). No hand-typed copy of the stored shape: both sides use ``models/job_specs.py``.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from api.audio_validation import (
    parse_generate,
    parse_generation,
    parse_speech,
    resolve_audio,
    resolve_generate,
    resolve_speech,
)
from api.validation import parse_create, resolve
from models.catalog import BUILTIN_SPECS
from models.db import Job, job_spec
from models.job_specs import (
    AudioJobOutput,
    AudioSpec,
    SamplerOptions,
    VideoSpec,
    audio_shape,
    parse_spec,
)
from storage.settings import Settings
from tests.helpers import video_spec
from workers.pipelines.base import GenerationRequest


@pytest.fixture
def settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def _stored(job: Job) -> Job:
    """The row as a worker reads it back: its spec through JSON, like the database."""
    job.spec = json.loads(json.dumps(job.spec))
    return job


def test_a_video_request_reaches_the_adapter_as_asked(settings: Settings) -> None:
    req = parse_create(
        {
            "prompt": "a red fox",
            "size": "64x48",
            "seconds": "0.5",
            "fps": "16",
            "seed": "9",
            "num_inference_steps": "3",
            "guidance_scale": "7.5",
            "negative_prompt": "blur",
            "extra_params": '{"motion": 2}',
            "timeout": "120",
        }
    )
    spec = resolve(req, BUILTIN_SPECS, settings)
    job = _stored(Job.new(spec, id="video_x", owner="local", idempotency_key="k"))

    # the row's read columns are the spec's
    assert (job.kind, job.model, job.prompt, job.seed, job.num_inference_steps) == (
        "video",
        "reference/video",
        "a red fox",
        9,
        3,
    )
    assert (job.width, job.height, job.fps, job.num_frames, job.duration_ms) == (
        64,
        48,
        16.0,
        8,
        None,
    )
    assert (job.status, job.progress, job.stage, job.idempotency_key) == ("queued", 0, "queue", "k")
    # the worker gets the same spec, and the adapter the request it describes
    assert job_spec(job) == spec and spec.seconds == "0.5"
    request = GenerationRequest(job_spec(job))
    assert (request.width, request.height, request.num_frames, request.fps) == (64, 48, 8, 16.0)
    assert (request.seed, request.num_inference_steps, request.duration_s) == (9, 3, None)
    assert request.negative_prompt == "blur" and request.guidance_scale == 7.5
    assert request.sampler.model_dump() == {"guidance_scale": 7.5}
    assert request.options == {} and request.extra == {"motion": 2.0}


@pytest.mark.parametrize(
    ("build", "duration_ms", "fmt", "stream_pcm"),
    [
        (
            lambda s: resolve_audio(
                parse_generation({"prompt": "rain", "seconds": "1.5"}), BUILTIN_SPECS, s
            ),
            1500,
            "wav",
            False,
        ),
        (
            lambda s: resolve_audio(
                parse_generation(
                    {"input": "rain", "audio_length": "2.25", "response_format": "pcm"}
                ),
                BUILTIN_SPECS,
                s,
            ),
            2250,
            "pcm",
            True,
        ),
        (
            lambda s: resolve_speech(
                parse_speech({"input": "two words", "voice": "alloy", "response_format": "pcm"}),
                BUILTIN_SPECS,
                s,
            ),
            1100,
            "pcm",
            True,
        ),
        (
            lambda s: resolve_generate(
                parse_generate(
                    {"input": "a drum", "audio_length": 0.25, "response_format": "flac"}
                ),
                BUILTIN_SPECS,
                s,
            ),
            250,
            "flac",
            False,
        ),
    ],
    ids=["generations", "pcm-generations", "speech", "generate"],
)
def test_an_audio_request_is_a_duration_not_frames(
    settings: Settings, build: object, duration_ms: int, fmt: str, stream_pcm: bool
) -> None:
    spec = build(settings)  # type: ignore[operator]
    assert isinstance(spec, AudioSpec)
    job = _stored(Job.new(spec, id="audio_x", owner="local"))
    assert (job.kind, job.duration_ms, job.has_audio) == ("audio", duration_ms, True)
    assert (job.width, job.height, job.fps, job.num_frames) == (None, None, None, None)
    parsed = job_spec(job)
    assert parsed == spec and isinstance(parsed, AudioSpec)
    assert (parsed.response_format, parsed.stream_pcm) == (fmt, stream_pcm)
    assert parsed.seconds == f"{duration_ms / 1000:g}"
    # what status reads take from the stored spec (and, once made, the output)
    assert audio_shape(job.spec, None) == (fmt, spec.sample_rate, spec.channels)
    made = AudioJobOutput(sample_rate=8000, channels=2, num_samples=4).model_dump()
    assert audio_shape(job.spec, made) == (fmt, 8000, 2)
    request = GenerationRequest(parsed)
    assert request.duration_s == duration_ms / 1000
    assert (request.num_frames, request.fps, request.width, request.height) == (0, 0.0, 0, 0)


def test_a_request_made_outside_a_job_reads_as_one_made_from_a_spec() -> None:
    video = GenerationRequest.video(
        prompt="a red fox",
        width=64,
        height=48,
        num_frames=8,
        fps=16.0,
        num_inference_steps=3,
        seed=9,
        guidance_scale=7.5,
        extra={"motion": 2.0},
    )
    assert isinstance(video.spec, VideoSpec) and video.spec.options.guidance_scale == 7.5
    assert video.guidance_scale == 7.5 and video.sampler.model_dump() == {"guidance_scale": 7.5}
    assert (video.duration_s, video.options, video.quality, video.lora) == (
        None,
        {},
        "lossless",
        None,
    )
    audio = GenerationRequest.audio(
        prompt="rain", duration_s=1.5, num_inference_steps=3, seed=9, guidance_scale=3.0
    )
    assert isinstance(audio.spec, AudioSpec) and audio.spec.duration_ms == 1500
    assert audio.options == {"guidance_scale": 3.0} and audio.guidance_scale == 3.0
    assert (audio.width, audio.height, audio.num_frames, audio.fps) == (0, 0, 0, 0.0)
    assert audio.duration_s == 1.5 and audio.sampler == SamplerOptions()


def test_a_stored_spec_is_checked_when_parsed() -> None:
    video = video_spec().model_dump(mode="json")
    assert parse_spec(video).kind == "video"
    with pytest.raises(ValidationError):  # a field the contract does not have
        parse_spec(video | {"params": {}})
    with pytest.raises(ValidationError):  # a kind the contract does not have
        parse_spec(video | {"kind": "image"})
    with pytest.raises(ValidationError):  # an audio spec without its length
        parse_spec(
            {
                k: v
                for k, v in video.items()
                if k
                not in (
                    "width",
                    "height",
                    "fps",
                    "num_frames",
                    "has_audio",
                    "reference_key",
                    "session_id",
                )
            }
            | {"kind": "audio"}
        )
