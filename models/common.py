"""Wire schemas shared by every protocol: the OpenAI error body, the model list, and
what every job kind (video, audio) shares: its status and its error."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from models.memory_plan import ModelMemory
from models.webhooks import WebhookFields


def refuse_bool(message: str) -> BeforeValidator:
    """A validator for a number field that refuses a boolean with ``message`` (pydantic's
    lax mode would read ``true`` as 1); each protocol words its own message."""

    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(message)
        return value

    return BeforeValidator(check)


# Numbers of request fields: booleans are refused; strings (multipart values) still
# parse, ASCII digits only.
_NoBool = refuse_bool("a boolean is not a number")
Int = Annotated[int, _NoBool]
Number = Annotated[float, _NoBool]


class JobRequestOptions(WebhookFields):
    """The options every job create body takes besides its own parameters: the model's
    ``extra_params``, a ``timeout`` in seconds, and the webhook fields. Unknown fields are
    refused (a misspelt parameter is a 400, not silently ignored)."""

    model_config = ConfigDict(extra="forbid")

    extra_params: dict[str, Any] = Field(default_factory=dict)
    timeout: Number | None = None
    # Seconds from creation the job may wait in the queue (RunPod's ``ttl``).
    ttl: Number | None = None


class JobStatus(enum.StrEnum):
    """A job's state, on the wire and in its row (any kind); ``cancelled`` is ``failed``
    with ``error.code`` ``cancelled``."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


class JobError(BaseModel):
    """Why a job failed: a stable ``code`` (``models.errors.ErrorCode``) and a message
    safe to show (never the text of an unexpected exception)."""

    code: str
    message: str


class StageDurations(BaseModel):
    # Seconds a job spent in each stage (models.videos.STAGES).
    queue: float = 0.0
    prepare: float = 0.0
    denoise: float = 0.0
    decode: float = 0.0
    encode: float = 0.0
    upload: float = 0.0


class JobObject(BaseModel):
    """What a job of any kind answers about itself (``GET /v1/videos/{id}``, …): the
    video job lifecycle. Each kind narrows ``object``, gives ``media_type`` its default and
    adds its own fields (they follow these on the wire)."""

    id: str
    object: str
    model: str
    status: JobStatus
    progress: int = 0
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    prompt: str
    seconds: str
    error: JobError | None = None
    # omniqueue / vLLM-Omni extensions
    queue_position: int | None = None
    # While queued: when the job should start (unix seconds), from the model's measured
    # run time and its running jobs; None without anything to go on.
    estimated_start_at: int | None = None
    # Seconds from creation the job may wait to start (None: no limit).
    ttl: int | None = None
    started_at: int | None = None
    seed: int
    num_inference_steps: int
    step: int = 0
    stage: str = "queue"
    media_type: str
    inference_time_s: float | None = None
    stage_durations: StageDurations = Field(default_factory=StageDurations)
    peak_memory_mb: float | None = None
    attempt: int = 0
    # The optional request fields that reached the model (``models/applied.py``): a field
    # the request sent that is not here was accepted and not used by this model.
    applied_params: list[str] = Field(default_factory=list)


Item = TypeVar("Item")


class ListPage(BaseModel, Generic[Item]):
    """A page of a job kind's list (``GET /v1/videos``, …): OpenAI's cursor page. Each
    kind names its own (``class VideoPage(ListPage[VideoObject])``), so the schema does."""

    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class Deleted(BaseModel):
    """The answer to deleting a job; each kind narrows ``object`` (``"video.deleted"``)."""

    id: str
    object: str
    deleted: bool = True


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class ModelLimits(BaseModel):
    """What a request to the model may ask for: the model's own limits intersected with
    the server's (``OMNIQ_LIMITS__*``), so a client (the playground) can build its form.
    Sizes are ``min_size``…``max_width`` × ``min_size``…``max_height`` in multiples of
    ``size_multiple``; frames ``frame_offset + k × frame_multiple``; ``max_seconds`` null
    where only ``max_frames`` caps the length."""

    min_size: int
    max_width: int
    max_height: int
    size_multiple: int
    default_size: str
    min_frames: int
    max_frames: int
    frame_multiple: int
    frame_offset: int
    default_fps: int
    max_fps: int
    default_seconds: float
    max_seconds: float | None
    min_steps: int
    max_steps: int
    default_steps: int
    supports_image_input: bool
    has_audio: bool
    # The most outputs one create may ask for (``n``).
    max_outputs: int = 1


class AudioLimits(BaseModel):
    """:class:`ModelLimits` of an audio model: the clip's length and the steps (a size,
    frames or fps would mean nothing for it)."""

    default_seconds: float
    max_seconds: float | None
    min_steps: int
    max_steps: int
    default_steps: int
    supports_image_input: bool = False
    has_audio: bool = True


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "omniqueue"
    modality: str = "video"
    # Which API serves it: ``job`` (/v1/videos or /v1/audio/generations), ``world``
    # (WS /v1/realtime/video) or ``voice`` (WS /v1/realtime).
    kind: Literal["job", "world", "voice"] = "job"
    description: str = ""
    # A video model's (ModelLimits) or an audio model's (AudioLimits): only its kind's.
    limits: ModelLimits | AudioLimits | None = None
    # The ``quality`` tiers a video create may ask for ("lossless" always; empty for
    # models that are not video job models).
    quality_tiers: list[str] = Field(default_factory=list)
    # Models that take ``lora``: the adapters ``lora.name`` may name alone (the server's
    # catalog, ``OMNIQ_LORA__ROOTS``); None for models without LoRA.
    loras: list[str] | None = None
    # The workflows a model serves: a joint video + audio model's (``t2va``, ``fl2va``,
    # ``ref2va``), a Wan model's (``t2v``, ``i2v``, ``flf2v``, ``v2v``); empty for the others.
    workflows: list[str] = Field(default_factory=list)
    # The attention kernel of each role of the denoiser (``sdpa``, ``vsa`` or ``cudnn``),
    # for models whose deployment chooses it (MiniMax-H3: ``blocks``, ``token_refiner``;
    # another family with ``attention = "cudnn"``: ``blocks``); else None.
    attention: dict[str, str] | None = None
    # VSA's key blocks per query block, where a role runs ``vsa``.
    vsa_topk: int | None = None
    # FP8 weights and offloading, for a model whose registry entry plans them: the plan,
    # and the FP8 layers and bytes saved that its live workers report; else None.
    memory: ModelMemory | None = None
    # False while no live worker can load the model: the workers that tried recorded why
    # (``unavailable_reason``: the path and what is missing there), and none serves it.
    # Its creates are then refused (503 ``model_unavailable``). True otherwise, also while
    # no worker has said anything (its jobs wait for one).
    available: bool = True
    unavailable_reason: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = {}
    # ``/ready``: served models that no live worker can load → why (as ``/v1/models``'
    # ``unavailable_reason``). They do not make the API unready: it serves the others.
    unavailable_models: dict[str, str] = {}
