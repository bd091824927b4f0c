"""Wire schemas of ``WS /v1/realtime/video`` (world sessions: streaming world-model video).

The contract is ``docs/protocols/realtime-video.md``; a client written for
vLLM-Omni's LingBot-World endpoint runs unchanged, so ``session.start`` accepts the
extra top-level fields that server accepts (``size``, ``seconds``, sampler knobs, …).
Control messages are JSON text frames with a ``type``; every
``video.chunk_metadata`` is followed by exactly one binary frame (an fMP4 fragment,
the first one carrying the ``ftyp``+``moov`` init segment).

Also here: the ``error.code`` values (``VideoErrorCode``). Beside it, pure as well:
:mod:`models.realtime_video_start` resolves a ``session.start`` into the rollout it asks
for, and :mod:`models.realtime_video_chunks` holds the chunk arithmetic and the
camera-block check.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from models.common import refuse_bool
from models.realtime_video_chunks import CameraActions, is_camera_block

VideoFormat = Literal["m4s"]
# "init": the fMP4 init segment (ftyp+moov) alone, first on a resumed socket
ChunkKind = Literal["media", "trailer", "init"]


# Numbers of session.start: booleans are not numbers, and every value is bounded so a
# 100-digit integer or 1e308 is a param error, never an overflow further on.
_NoBool = refuse_bool("must be a number, not a boolean")
_Side = Annotated[int, _NoBool, Field(ge=1, le=16384)]
_Count = Annotated[int, _NoBool, Field(ge=0, le=2**53)]
_Seed = Annotated[int, _NoBool, Field(ge=-(2**63), lt=2**63)]
_Float = Annotated[float, _NoBool, Field(ge=-1e6, le=1e6, allow_inf_nan=False)]
_Positive = Annotated[float, _NoBool, Field(gt=0, le=1e6, allow_inf_nan=False)]


# ---------------------------------------------------------------- client → server


class ImageReference(BaseModel):
    """The conditioning first frame: an ``http(s)`` or ``data:`` URL."""

    image_url: str


class ExtraParams(BaseModel):
    """``session.start.extra_params``; keys beyond these pass through to the pipeline."""

    model_config = ConfigDict(extra="allow")

    flow_shift: _Float | None = None
    # one entry per chunk, each three per-latent-frame key lists (shape checked by the
    # protocol, which knows the chunk count)
    camera_action_script: list[CameraActions] | None = None
    transition_chunks: Annotated[int, _NoBool, Field(ge=0, le=10**6)] | None = None
    persist: bool = False
    # pacing: chunks generated ahead of the client's playback (0: unpaced); None: the
    # server's ``realtime.video_lead_chunks``
    max_chunks_ahead: Annotated[int, _NoBool, Field(ge=0, le=10_000)] | None = None


class SessionStart(BaseModel):
    """``session.start``: must be the first message, within 10 s, at most 4 MiB.

    Fields left out are resolved by the server (defaults, ``size``/``seconds``).
    Unknown top-level keys are kept (``model_extra``), as vLLM-Omni accepts them.
    """

    model_config = ConfigDict(extra="allow")

    type: Literal["session.start"] = "session.start"
    model: str | None = None
    prompt: str
    width: _Side | None = None
    height: _Side | None = None
    num_frames: _Count | None = None
    fps: _Positive | None = None
    seed: _Seed | None = None
    negative_prompt: str | None = None
    image_reference: ImageReference | None = None
    format: VideoFormat = "m4s"
    extra_params: ExtraParams = Field(default_factory=ExtraParams)
    sampling_params: dict[str, Any] | None = None
    # vLLM-Omni VideoGenerationRequest fields its clients send at the top level
    size: str | None = None
    seconds: _Positive | None = None
    num_inference_steps: Annotated[int, _NoBool, Field(ge=1, le=10_000)] | None = None
    guidance_scale: _Float | None = None
    guidance_scale_2: _Float | None = None
    true_cfg_scale: _Float | None = None
    boundary_ratio: _Float | None = None
    flow_shift: _Float | None = None

    @field_validator("extra_params", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value


class InteractionEvent(BaseModel):
    """What an interaction changes: a target prompt, a camera action, or both."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    # a WASD block (three key lists) or a structured pose payload for the pipeline
    camera: CameraActions | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _something_to_apply(self) -> InteractionEvent:
        if self.prompt is None and self.camera is None:
            raise ValueError("event needs a prompt or a camera action")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("event.prompt must not be empty")
        if isinstance(self.camera, list) and not is_camera_block(self.camera):
            raise ValueError("event.camera must be three lists of w/a/s/d")
        return self


class Interaction(BaseModel):
    event_id: Annotated[str, Field(min_length=1)] | None = None  # server-made when omitted
    event: InteractionEvent
    transition_chunks: Annotated[int, Field(ge=0, strict=True)] | None = None


class SessionInteraction(BaseModel):
    """``session.interaction``: applied from a later chunk; ``event_id`` unique."""

    type: Literal["session.interaction"] = "session.interaction"
    interaction: Interaction


class SessionPing(BaseModel):
    """``session.ping``: refreshes the stall clock; answered with ``session.pong``."""

    type: Literal["session.ping"] = "session.ping"


class SessionStop(BaseModel):
    """``session.stop``: stop after the current step; ends with ``session.done``."""

    type: Literal["session.stop"] = "session.stop"


class SessionResume(BaseModel):
    """``session.resume``, instead of ``session.start`` as the first message of a socket:
    re-attach a session whose socket dropped (``video.start`` gave its id and token)."""

    type: Literal["session.resume"] = "session.resume"
    session_id: str
    resume_token: str
    last_generation_chunk_index: int = Field(ge=-1)


ClientEvent = Annotated[
    SessionStart | SessionInteraction | SessionPing | SessionStop,
    Field(discriminator="type"),
]
CLIENT_EVENT_TYPES = frozenset(
    {"session.start", "session.interaction", "session.ping", "session.stop"}
)


# ---------------------------------------------------------------- server → client


class _ServerEvent(BaseModel):
    # optional fields that are left out of the JSON when unset (vLLM-Omni omits them)
    _omit_none: ClassVar[bool] = False

    def to_json(self) -> str:
        """The JSON text frame of this event."""
        return self.model_dump_json(exclude_none=self._omit_none)


class VideoConfig(BaseModel):
    """The resolved rollout, echoed in ``video.start``."""

    width: int
    height: int
    fps: float
    num_frames: int
    chunks: Annotated[int, Field(ge=1)]
    # denoise steps of every chunk: ``num_inference_steps``, else the model's default
    num_inference_steps: int | None = None


class VideoStart(_ServerEvent):
    type: Literal["video.start"] = "video.start"
    request_id: str
    format: VideoFormat = "m4s"
    config: VideoConfig
    # resume extension: what ``session.resume`` needs (clients that ignore them may)
    session_id: str | None = None
    resume_token: str | None = None


class VideoChunkMetadata(_ServerEvent):
    """Announces the next binary frame; ``generation_chunk_index`` is null for a trailer."""

    type: Literal["video.chunk_metadata"] = "video.chunk_metadata"
    request_id: str
    kind: ChunkKind
    generation_chunk_index: int | None
    transport_chunk_index: int
    num_frames: int
    byte_length: int
    started_event_ids: list[str] = Field(default_factory=list)
    active_event_ids: list[str] = Field(default_factory=list)
    completed_event_ids: list[str] = Field(default_factory=list)
    produced_at: float


class SessionInteractionQueued(_ServerEvent):
    type: Literal["session.interaction.queued"] = "session.interaction.queued"
    request_id: str
    event_id: str


class SessionResumed(_ServerEvent):
    """A resumed socket's first frame; the init segment and the chunks after the client's
    last one follow."""

    type: Literal["session.resumed"] = "session.resumed"
    request_id: str
    session_id: str
    next_generation_chunk_index: int


class SessionPong(_ServerEvent):
    type: Literal["session.pong"] = "session.pong"


class SessionDone(_ServerEvent):
    """End of a session: ``chunks`` media chunks sent; ``artifact_id`` when persisted."""

    _omit_none: ClassVar[bool] = True

    type: Literal["session.done"] = "session.done"
    request_id: str
    chunks: int
    stopped: bool
    artifact_id: str | None = None


class ErrorEvent(_ServerEvent):
    _omit_none: ClassVar[bool] = True

    type: Literal["error"] = "error"
    message: str
    code: str | None = None
    request_id: str | None = None
    event_id: str | None = None
    # the offending field of the client's message (``num_frames``, ``extra_params.x``)
    param: str | None = None


ServerEvent = Annotated[
    VideoStart
    | VideoChunkMetadata
    | SessionInteractionQueued
    | SessionPong
    | SessionDone
    | ErrorEvent
    | SessionResumed,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------- error codes


class VideoErrorCode(enum.StrEnum):
    """``error.code`` values of this endpoint."""

    MESSAGE_TOO_LARGE = "message_too_large"
    INVALID_JSON = "invalid_json"
    SESSION_START_REQUIRED = "session_start_required"
    START_TIMEOUT = "start_timeout"
    INVALID_REQUEST = "invalid_request"
    INVALID_SIZE = "invalid_size"
    INVALID_NUM_FRAMES = "invalid_num_frames"
    UNSUPPORTED_FORMAT = "unsupported_format"
    INVALID_CAMERA_ACTION_SCRIPT = "invalid_camera_action_script"
    INVALID_IMAGE_REFERENCE = "invalid_image_reference"
    MODEL_NOT_FOUND = "model_not_found"
    UNKNOWN_EVENT = "unknown_event"
    INVALID_EVENT = "invalid_event"
    INVALID_INTERACTION = "invalid_interaction"
    EVENT_ID_CONFLICT = "event_id_conflict"
    INVALID_STATE = "invalid_state"
    BINARY_NOT_SUPPORTED = "binary_not_supported"
    STALLED = "stalled"
    SESSION_EXPIRED = "session_expired"  # ran past realtime.max_session_s
    # reported by the worker side
    RESOURCE_EXHAUSTED = "resource_exhausted"
    MODEL_UNAVAILABLE = "model_unavailable"  # no live worker can load the model
    WORKER_LOST = "worker_lost"
    INTERACTION_FAILED = "interaction_failed"
    # an interaction that no chunk is left to apply to (sent after the last chunk was
    # made, or queued but never started by the end of the rollout); the session goes on
    INTERACTION_TOO_LATE = "interaction_too_late"
    INTERNAL_ERROR = "internal_error"
    BROKER_ERROR = "broker_error"  # the API lost Redis/Valkey mid-session (close 1011)
    # session.resume: no such session (or wrong token, or expired), close 1008; and the
    # socket a session was resumed away from, close 1008
    SESSION_NOT_FOUND = "session_not_found"
    SESSION_TAKEN_OVER = "session_taken_over"


def describe_error(exc: ValidationError) -> str:
    """``where: what`` of the first error, for an ``error`` event."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "message"
    return f"{where}: {first['msg']}"
