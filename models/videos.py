"""Wire schemas of ``/v1/videos`` (OpenAI Videos API, vLLM-Omni extensions after)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from models.common import (
    Deleted,
    Int,
    JobError,
    JobRequestOptions,
    JobStatus,
    ListPage,
    Number,
)

# The names of the first job kind; every job kind uses the same two (models/common.py).
VideoStatus = JobStatus
VideoError = JobError
STAGES = ("queue", "prepare", "denoise", "decode", "encode", "upload")


class VideoCreate(JobRequestOptions):
    """A create request after alias normalization, before model validation.

    Both ``multipart/form-data`` and JSON bodies become this; multipart values arrive as
    strings and pydantic's lax mode parses ``"4"``, ``"7.5"`` and ``"true"``.
    """

    # extra_params, timeout, webhook_url/webhook_events: from JobRequestOptions.

    prompt: str
    model: str | None = None
    size: str | None = None
    width: Int | None = None
    height: Int | None = None
    seconds: Number | None = None
    num_frames: Int | None = None
    fps: Number | None = None
    num_inference_steps: Int | None = None
    guidance_scale: Number | None = None
    guidance_scale_2: Number | None = None
    true_cfg_scale: Number | None = None
    flow_shift: Number | None = None
    boundary_ratio: Number | None = None
    seed: Int | None = None
    negative_prompt: str | None = None
    lora: dict[str, Any] | None = None
    n: Int = 1
    vae_use_slicing: bool | None = None
    vae_use_tiling: bool | None = None
    input_reference_url: str | None = None


class StageDurations(BaseModel):
    queue: float = 0.0
    prepare: float = 0.0
    denoise: float = 0.0
    decode: float = 0.0
    encode: float = 0.0
    upload: float = 0.0


class VideoObject(BaseModel):
    id: str
    object: Literal["video"] = "video"
    model: str
    status: JobStatus
    progress: int = 0
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    prompt: str
    size: str
    seconds: str
    error: JobError | None = None
    remixed_from_video_id: str | None = None
    # omniqueue / vLLM-Omni extensions
    queue_position: int | None = None
    started_at: int | None = None
    fps: float
    num_frames: int
    seed: int
    num_inference_steps: int
    step: int = 0
    stage: str = "queue"
    media_type: str = "video/mp4"
    has_audio: bool = False
    inference_time_s: float | None = None
    stage_durations: StageDurations = Field(default_factory=StageDurations)
    peak_memory_mb: float | None = None
    attempt: int = 0


class VideoPage(ListPage[VideoObject]):
    pass


class VideoDeleted(Deleted):
    object: Literal["video.deleted"] = "video.deleted"
