"""What a job pipeline's ``prepare`` gets (:class:`~workers.pipelines.base.Pipeline`): the
job's typed spec (``models/job_specs.py``) as it is, with the conditioning inputs the
executor fetched and decoded. ``workers/pipelines/base.py`` re-exports both classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from models.catalog import QualityTier
from models.job_specs import AudioSpec, LoraSpec, SamplerOptions, VideoSpec


@dataclass
class MediaReference:
    """One decoded conditioning input of a request, in the order the client sent it: an
    image (``frames`` uint8 H×W×3), a video (``frames`` uint8 T×H×W×3 at ``fps``, with
    its soundtrack in ``audio`` when it has one) or an audio clip (``audio``); audio is
    float32 (channels, samples) at ``sample_rate``."""

    kind: Literal["image", "video", "audio"]
    frames: np.ndarray | None = None
    fps: float | None = None
    audio: np.ndarray | None = None
    sample_rate: int | None = None


@dataclass
class GenerationRequest:
    """A job as its adapter reads it: the job's :mod:`models.job_specs` spec, held as it
    is, with the conditioning inputs the executor fetched and decoded. The spec's fields
    are read-only properties: a video clip is ``num_frames`` at ``fps``; an audio clip is
    ``duration_s`` long (its frame fields are 0). A request made outside a job (a
    warm-up, a session's scene, a test) comes from :meth:`video` or :meth:`audio`."""

    spec: VideoSpec | AudioSpec
    # First frame for image-to-video: uint8 H×W×3 (already resized to width×height).
    reference_image: np.ndarray | None = None
    # Last frame (first/last-keyframe workflows): uint8 H×W×3.
    last_image: np.ndarray | None = None
    # Ordered references (omni-reference workflows), as the client sent them.
    references: list[MediaReference] = field(default_factory=list)

    @classmethod
    def video(
        cls,
        *,
        prompt: str,
        width: int,
        height: int,
        num_frames: int,
        fps: float,
        num_inference_steps: int,
        seed: int,
        negative_prompt: str | None = None,
        guidance_scale: float | None = None,
        sampler: SamplerOptions | None = None,
        extra: dict[str, Any] | None = None,
        quality: QualityTier = "lossless",
        lora: LoraSpec | None = None,
        reference_image: np.ndarray | None = None,
        last_image: np.ndarray | None = None,
        references: list[MediaReference] | None = None,
        model: str = "",
    ) -> GenerationRequest:
        """A video request from its fields (``guidance_scale`` goes into the sampler
        settings, where a job's spec keeps it)."""
        options = sampler or SamplerOptions()
        if guidance_scale is not None:
            options = options.model_copy(update={"guidance_scale": guidance_scale})
        spec = VideoSpec(
            model=model,
            prompt=prompt,
            width=width,
            height=height,
            num_frames=num_frames,
            fps=fps,
            num_inference_steps=num_inference_steps,
            seed=seed,
            negative_prompt=negative_prompt,
            options=options,
            extra=extra or {},
            quality=quality,
            lora=lora,
        )
        return cls(spec, reference_image, last_image, list(references or []))

    @classmethod
    def audio(
        cls,
        *,
        prompt: str,
        duration_s: float,
        num_inference_steps: int,
        seed: int,
        negative_prompt: str | None = None,
        guidance_scale: float | None = None,
        options: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        model: str = "",
    ) -> GenerationRequest:
        """An audio request from its fields (``duration_s`` to the millisecond, as a
        spec keeps it; ``guidance_scale`` goes into ``options``, where a spec keeps it)."""
        declared = dict(options or {})
        if guidance_scale is not None:
            declared["guidance_scale"] = guidance_scale
        spec = AudioSpec(
            model=model,
            prompt=prompt,
            duration_ms=round(duration_s * 1000),
            num_inference_steps=num_inference_steps,
            seed=seed,
            negative_prompt=negative_prompt,
            options=declared,
            extra=extra or {},
        )
        return cls(spec)

    @property
    def prompt(self) -> str:
        return self.spec.prompt

    @property
    def negative_prompt(self) -> str | None:
        return self.spec.negative_prompt

    @property
    def num_inference_steps(self) -> int:
        return self.spec.num_inference_steps

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def extra(self) -> dict[str, Any]:
        """``extra_params`` as the model's schema checked them."""
        return self.spec.extra

    @property
    def width(self) -> int:
        return self.spec.width if isinstance(self.spec, VideoSpec) else 0

    @property
    def height(self) -> int:
        return self.spec.height if isinstance(self.spec, VideoSpec) else 0

    @property
    def num_frames(self) -> int:
        return self.spec.num_frames if isinstance(self.spec, VideoSpec) else 0

    @property
    def fps(self) -> float:
        return self.spec.fps if isinstance(self.spec, VideoSpec) else 0.0

    @property
    def duration_s(self) -> float | None:
        """An audio clip's length in seconds; None for video."""
        return self.spec.duration_s if isinstance(self.spec, AudioSpec) else None

    @property
    def guidance_scale(self) -> float | None:
        if isinstance(self.spec, AudioSpec):
            value: float | None = self.spec.options.get("guidance_scale")
            return value
        return self.spec.options.guidance_scale

    @property
    def sampler(self) -> SamplerOptions:
        """A video's sampler settings (guidance_scale_2, flow_shift, vae_use_tiling, …)."""
        if isinstance(self.spec, VideoSpec):
            return self.spec.options
        return SamplerOptions()

    @property
    def options(self) -> dict[str, Any]:
        """An audio clip's declared options (speed, voice, instructions, …); {} for video."""
        return self.spec.options if isinstance(self.spec, AudioSpec) else {}

    @property
    def quality(self) -> QualityTier:
        """The cache tier (``quality``): "lossless" runs every denoise step in full."""
        return self.spec.quality if isinstance(self.spec, VideoSpec) else "lossless"

    @property
    def lora(self) -> LoraSpec | None:
        """The LoRA adapter to run with (video jobs of models that list ``lora``)."""
        return self.spec.lora if isinstance(self.spec, VideoSpec) else None
