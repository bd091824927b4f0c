"""Wire schemas of ``/v1/videos`` (OpenAI Videos API, vLLM-Omni extensions after)."""

from __future__ import annotations

from typing import Any, Literal

from models.catalog import QualityTier
from models.common import (
    Deleted,
    Int,
    JobObject,
    JobRequestOptions,
    ListPage,
    Number,
)

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
    # vLLM-Omni's cache tier: "lossless" (the default), "high" or "fast" (models.catalog).
    quality: QualityTier | None = None
    n: Int = 1
    vae_use_slicing: bool | None = None
    vae_use_tiling: bool | None = None
    input_reference_url: str | None = None


class VideoObject(JobObject):
    object: Literal["video"] = "video"
    size: str
    remixed_from_video_id: str | None = None
    fps: float
    num_frames: int
    media_type: str = "video/mp4"
    has_audio: bool = False
    # The cache tier the job runs with (``quality`` of the create; "lossless" by default).
    quality: QualityTier = "lossless"


class VideoPage(ListPage[VideoObject]):
    pass


class VideoDeleted(Deleted):
    object: Literal["video.deleted"] = "video.deleted"
