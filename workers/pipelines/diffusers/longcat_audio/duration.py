"""A LongCat clip's length in latent frames, as ``LongCatAudioDiTPipeline.__call__``
computes it from a request (the adapter's module docstring says how ``duration_seconds``
and ``speed`` enter it)."""

from __future__ import annotations

from typing import Any

from diffusers.pipelines.longcat_audio_dit.pipeline_longcat_audio_dit import (
    _approx_duration_from_text,
    _normalize_text,
)

from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest


def clip_seconds(pipe: Any, request: GenerationRequest) -> float | None:
    """``__call__``'s ``audio_duration_s`` for ``request`` (module docstring); None: the
    estimate from the text at speed 1, exactly as ``__call__`` without a duration."""
    options = request.options
    given = options.get("duration_seconds")
    speed = float(options.get("speed") or 1.0)
    if given is not None:
        if speed != 1.0:
            raise InvalidJobInput(
                "speed cannot change a clip whose length is given (duration_seconds)",
                param="speed",
            )
        return float(given)
    if speed == 1.0:
        return None
    text = _normalize_text(request.prompt)
    return _approx_duration_from_text([text], pipe.max_wav_duration) / speed


def duration_frames(pipe: Any, request: GenerationRequest) -> int:
    """The clip's length in latent frames, as ``__call__`` computes it."""
    seconds = clip_seconds(pipe, request)
    if seconds is None:
        seconds = _approx_duration_from_text([_normalize_text(request.prompt)])
    duration = int(seconds * pipe.sample_rate // pipe.vae_scale_factor)
    max_duration = int(pipe.max_wav_duration * pipe.sample_rate // pipe.vae_scale_factor)
    return max(1, min(duration, max_duration))
