"""Wire schemas of ``/v1/videos`` (OpenAI Videos API, vLLM-Omni extensions after)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator
from pydantic_core import PydanticCustomError

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


class LoraRequest(BaseModel):
    """A request's ``lora``: one LoRA adapter, in vLLM-Omni's shape (its ComfyUI node sends
    it, as JSON text in multipart forms), e.g. ``{"name": "style", "scale": 0.8}``.

    Named by ``name`` alone (an adapter of the server's catalog, which ``GET /v1/models``
    lists), or by ``local_path`` (then ``name`` is only a label). The values here are the
    shape; where the adapter is, and ``scale``'s range, the server checks against its
    ``OMNIQ_LORA__ROOTS`` (``api/loras.py``) before anything is stored. JSON numbers only:
    ``"0.8"`` is not a scale and ``true`` not an id.
    """

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Strict()] | None = Field(
        default=None, description="An adapter of the server's catalog, or a label."
    )
    local_path: Annotated[str, Strict()] | None = Field(
        default=None,
        description="An absolute path (a .safetensors file or an adapter directory) or an "
        "s3:// URL, under one of the server's LoRA roots.",
    )
    scale: Annotated[float, Strict(), Field(allow_inf_nan=False)] | None = Field(
        default=None, description="The adapter's weight; 1 when left out."
    )
    int_id: Annotated[int, Strict(), Field(ge=0, lt=2**63)] | None = Field(
        default=None,
        description="vLLM-Omni's adapter cache id: 0 or null only (an adapter is known "
        "by its name or local_path here; another value is refused).",
    )

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        """A bare string (``"lora": "my-style"``) is a common mistake: say what lora is."""
        if not isinstance(value, dict | LoraRequest):
            raise PydanticCustomError(
                "lora_type",
                'must be a JSON object with a "name" (an adapter GET /v1/models lists) or '
                'a "local_path", e.g. {"name": "my-style", "scale": 0.8}',
            )
        return value


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
    lora: LoraRequest | None = None
    # vLLM-Omni's cache tier: "lossless" (the default), "high" or "fast" (models.catalog).
    quality: QualityTier | None = None
    n: Int = 1
    vae_use_slicing: bool | None = None
    vae_use_tiling: bool | None = None
    input_reference_url: str | None = None


class VideoOutput(BaseModel):
    """One output of a video job: ``GET /v1/videos/{id}/content?index={index}`` (and its
    ``variant=thumbnail``) once the job completed."""

    index: int
    seed: int  # the job's seed + index: an n = 1 job of this seed makes the same clip


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
    # The create's ``n``: the job makes its outputs one after another, listed here.
    n: int = 1
    outputs: list[VideoOutput] = Field(default_factory=list)


class VideoPage(ListPage[VideoObject]):
    pass


class VideoDeleted(Deleted):
    object: Literal["video.deleted"] = "video.deleted"
