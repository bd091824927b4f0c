"""``GET /v1/models``'s entries: each served model with what a request may ask of it."""

from __future__ import annotations

from models.catalog import ModelSpec
from models.common import AudioLimits, ModelLimits, ModelObject
from models.memory_plan import MemoryReport, model_memory
from storage.settings import LimitSettings


def quality_tiers(spec: ModelSpec) -> list[str]:
    """The ``quality`` values a create may send for ``spec``: "lossless" and the model's
    own tiers, for video job models; none for the others."""
    if spec.streaming or spec.modality != "video":
        return []
    return list(spec.offered_tiers)


def clip_limits(spec: ModelSpec, limits: LimitSettings) -> AudioLimits:
    """What every model lists, and all an audio model does: a clip's length and the
    steps, a job model's within the server's limits, a streaming model's as it declares."""
    job = not spec.streaming
    seconds = min(spec.max_seconds or limits.max_seconds, limits.max_seconds)
    return AudioLimits(
        default_seconds=spec.default_seconds,
        max_seconds=seconds if job else spec.max_seconds,
        min_steps=spec.min_steps,
        max_steps=min(spec.max_steps, limits.max_steps) if job else spec.max_steps,
        default_steps=spec.default_steps,
        supports_image_input=spec.supports_image_input,
    )


def video_limits(spec: ModelSpec, limits: LimitSettings, clip: AudioLimits) -> ModelLimits:
    """A video model's limits: its sizes, frames and fps (a job model's within the
    server's limits), and the ``clip`` every model lists (:func:`clip_limits`)."""
    job = not spec.streaming
    width, height = spec.default_size
    return ModelLimits(
        min_size=spec.min_size,
        max_width=min(spec.max_width, limits.max_width) if job else spec.max_width,
        max_height=min(spec.max_height, limits.max_height) if job else spec.max_height,
        size_multiple=spec.size_multiple,
        default_size=f"{width}x{height}",
        min_frames=spec.min_frames,
        max_frames=min(spec.max_frames, limits.max_frames) if job else spec.max_frames,
        frame_multiple=spec.frame_multiple,
        frame_offset=spec.frame_offset,
        default_fps=spec.default_fps,
        max_fps=spec.max_fps,
        default_seconds=clip.default_seconds,
        max_seconds=clip.max_seconds,
        min_steps=clip.min_steps,
        max_steps=clip.max_steps,
        default_steps=clip.default_steps,
        supports_image_input=clip.supports_image_input,
        has_audio=spec.has_audio,
        max_outputs=spec.max_outputs if job else 1,  # a session makes one stream
    )


def model_object(
    spec: ModelSpec,
    limits: LimitSettings,
    loras: list[str] | None = None,
    unavailable: str | None = None,
    memory: MemoryReport | None = None,
) -> ModelObject:
    """``spec`` as listed: job models within the server's limits (the checks of
    ``api/validation.py``); streaming models as they declare (their sessions have their
    own caps, ``docs/streaming.md``). ``loras``: the adapter catalog's names, listed for
    models that take ``lora``. ``unavailable``: why no live worker can load it, if so
    (``api/model_availability.py``). ``memory``: a live worker's report of its memory
    plan (FP8 layers, bytes saved), listed with the plan."""
    clip = clip_limits(spec, limits)
    kind_limits = clip if spec.modality == "audio" else video_limits(spec, limits, clip)
    return ModelObject(
        id=spec.name,
        owned_by=spec.owned_by,
        modality=spec.modality,
        kind=spec.kind,
        description=spec.description,
        quality_tiers=quality_tiers(spec),
        loras=(loras or []) if spec.supports_lora else None,
        workflows=list(spec.workflows),
        attention=dict(spec.attention) or None,
        vsa_topk=spec.vsa_topk,
        memory=model_memory(spec.memory, memory),
        available=unavailable is None,
        unavailable_reason=unavailable,
        limits=kind_limits,
    )
