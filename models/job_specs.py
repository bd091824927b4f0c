"""Job specs: the API↔worker contract of a job, one model per kind, discriminated by ``kind``.

The API builds a spec once, from a request that passed validation (``api/validation.py``,
``api/audio_validation.py``); :meth:`models.db.Job.new` stores it in the job's ``spec``
column and copies the fields that reads and queries need into the row's columns; the
worker parses it back (:func:`parse_spec`) and runs the job from it. Nothing else
travels between the tiers: the Celery message carries the job id only.

A spec says what was asked for and never changes after the insert; what the worker made
(an audio file's real rate and channels) is the row's ``output`` (:class:`AudioJobOutput`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

from models.audio import AudioFormat
from models.catalog import QualityTier
from models.webhooks import JobWebhook


class LoraSpec(BaseModel):
    """A LoRA adapter a job runs with, as the API resolved it (``api/loras.py``).

    ``path`` is where the worker reads it: an absolute local path with symlinks and
    ``..`` resolved, inside one of the server's allow-listed directory roots, or
    ``s3://bucket/key`` under an allow-listed S3 root. ``version`` names that file's
    content for the worker's adapter cache (the S3 ETag; None for a local file, whose
    size and mtime the worker reads itself). ``scale`` multiplies the adapter's own
    ``alpha / r``. (vLLM-Omni's ``int_id`` stops at the API: ``api/loras.py`` refuses a set
    one.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    scale: float = 1.0
    version: str | None = None


class ReferenceInput(BaseModel):
    """One stored keyframe or omni-reference of a job (api/references.py): what it is, its
    S3 key under the job's prefix and, for a keyframe, its anchor (0: first, -1: last)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["image", "video", "audio"]
    key: str
    frame_index: int | None = None


class SamplerOptions(BaseModel):
    """The sampler settings a video request may set (``api/validation.py`` keeps those the
    model declares in ``parameters``); None: the pipeline's own default. Stored as the
    spec's ``options`` object with these keys, the unset ones left out, so rows written
    when ``options`` was a plain dict parse unchanged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    guidance_scale: float | None = None
    guidance_scale_2: float | None = None
    true_cfg_scale: float | None = None
    flow_shift: float | None = None
    boundary_ratio: float | None = None
    vae_use_slicing: bool | None = None
    vae_use_tiling: bool | None = None

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        return {k: v for k, v in out.items() if v is not None}


class _Spec(BaseModel):
    """What every kind of job needs to run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    prompt: str
    seed: int
    num_inference_steps: int
    # Seconds the job may run; None: the server's default.
    timeout_s: float | None = None
    # Seconds from creation the job may wait to start; None: no limit.
    ttl_s: int | None = None
    negative_prompt: str | None = None
    # ``extra_params`` checked against the model's schema.
    extra: dict[str, Any] = Field(default_factory=dict)
    # Where the job's terminal event goes besides its key's endpoints (the worker never
    # reads it; storage/outbox.py does, when the job ends).
    webhook: JobWebhook | None = None


class VideoSpec(_Spec):
    """A video clip (``/v1/videos``, or a persisted realtime session)."""

    kind: Literal["video"] = "video"
    # The sampler settings the request set that the model declares.
    options: SamplerOptions = Field(default_factory=SamplerOptions)
    width: int
    height: int
    fps: float
    # The model's real frame count (snapped to its lattice), not the one asked for.
    num_frames: int
    has_audio: bool = False
    # The cache tier (``quality``): "lossless" runs every step in full.
    quality: QualityTier = "lossless"
    # The S3 key of the first frame for image-to-video (a PNG under the job's prefix).
    reference_key: str | None = None
    # Keyframes and omni-references of a workflow model, in the client's order.
    references: list[ReferenceInput] = Field(default_factory=list)
    # Set when the job records a world session that finished elsewhere.
    session_id: str | None = None
    # A per-request LoRA adapter (models that list ``lora`` in their parameters).
    lora: LoraSpec | None = None
    # Outputs of the job (the create's ``n``): output k is the clip of seed ``seed + k``,
    # as an ``n = 1`` job with that seed makes it.
    n: int = Field(default=1, ge=1)

    def output(self, index: int) -> VideoSpec:
        """The spec of output ``index`` alone: seed ``seed + index``, one output."""
        return self.model_copy(update={"seed": self.seed + index, "n": 1})

    @property
    def seconds(self) -> str:
        """The clip length as the wire reports it (``"4"``, ``"2.5"``)."""
        return video_seconds(self.num_frames, self.fps)


def output_variant(variant: str, index: int) -> str:
    """The artifact variant of output ``index`` of a job (``video``, ``thumbnail``, …):
    the variant itself for output 0 (as every job of one output has it), else
    ``{variant}.{index}``."""
    return variant if index == 0 else f"{variant}.{index}"


class AudioSpec(_Spec):
    """An audio clip (``/v1/audio/generations``, ``/speech``, ``/generate``)."""

    kind: Literal["audio"] = "audio"
    # Declared optional parameters the model takes (guidance_scale, speed, voice, …).
    options: dict[str, Any] = Field(default_factory=dict)
    duration_ms: int = Field(ge=1)
    response_format: AudioFormat = "wav"
    # The artifact's rate and channels as asked for; None: the model's own.
    sample_rate: int | None = None
    channels: int | None = None
    # Publish the PCM16 samples as ``chunk`` events as soon as they are decoded.
    stream_pcm: bool = False

    @property
    def seconds(self) -> str:
        return audio_seconds(self.duration_ms)

    @property
    def duration_s(self) -> float:
        return self.duration_ms / 1000


JobSpec = Annotated[VideoSpec | AudioSpec, Field(discriminator="kind")]

_SPEC: TypeAdapter[VideoSpec | AudioSpec] = TypeAdapter(JobSpec)


def parse_spec(stored: dict[str, Any]) -> VideoSpec | AudioSpec:
    """A spec as stored in a job row (``Job.spec``) → its typed model."""
    return _SPEC.validate_python(stored)


class AudioJobOutput(BaseModel):
    """What an audio job made: the artifact's real rate, channels and length."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sample_rate: int
    channels: int
    num_samples: int


class AudioShape(NamedTuple):
    """What an audio job's wire object says about its file: the format, and the rate and
    channels of the artifact once made (until then, the ones asked for)."""

    response_format: AudioFormat
    sample_rate: int | None
    channels: int | None


def audio_shape(spec: dict[str, Any], output: dict[str, Any] | None) -> AudioShape:
    """:class:`AudioShape` of a stored :class:`AudioSpec` and :class:`AudioJobOutput`, read at
    dict speed for status reads and list pages (validating both costs ~9 us a row; they
    were validated when written: :meth:`models.db.Job.new`, the executor)."""
    if output:
        return AudioShape(spec["response_format"], output["sample_rate"], output["channels"])
    return AudioShape(spec["response_format"], spec.get("sample_rate"), spec.get("channels"))


def video_seconds(num_frames: int, fps: float) -> str:
    return f"{num_frames / fps:g}"


def audio_seconds(duration_ms: int) -> str:
    return f"{duration_ms / 1000:g}"
