"""What a job asks of MiniMax-H3, as the keyword arguments of diffusers' modular
pipeline: prompt, canvas, keyframes and ordered references (as diffusers' reference
dataclasses, soundtracks at the audio VAE's rate), the two sigma shifts, and the sigma
points a request's ``num_inference_steps`` stands for (:func:`sigma_points`). The
differential tests call ``pipe(...)`` with exactly :func:`call_inputs`."""

from __future__ import annotations

from typing import Any, Literal, get_args

import numpy as np
import torch
from diffusers.modular_pipelines.minimax_h3 import (
    MiniMaxH3AudioReference,
    MiniMaxH3ImageReference,
    MiniMaxH3VideoReference,
)
from PIL import Image

from workers.media.audio import prepare_audio
from workers.pipelines.base import GenerationRequest, MediaReference

# What a request's ``num_inference_steps`` counts on a deployment (the adapter option
# ``steps``): the points of H3's sigma schedule, as its schedulers and vLLM-Omni's API for H3
# count them (N points: N - 1 transformer evaluations), or the transformer evaluations
# themselves (N: N + 1 sigma points), as the ComfyUI node's FastH3 path sends them (4).
StepCount = Literal["sigma_points", "evaluations"]


def step_count(value: str) -> StepCount:
    """The adapter option ``steps``, checked (a registry entry's typo refuses to start)."""
    for count in get_args(StepCount):
        if value == count:
            return count
    raise ValueError(f"steps must be 'sigma_points' or 'evaluations', got {value!r}")


def sigma_points(num_inference_steps: int, count: StepCount) -> int:
    """The sigma points diffusers' H3 schedulers are given for a request's steps."""
    return num_inference_steps + 1 if count == "evaluations" else num_inference_steps


def shifts_of(request: GenerationRequest) -> tuple[float | None, float | None]:
    """The (video, audio) sigma shifts a request asks for; None keeps the checkpoint's."""
    return request.sampler.flow_shift, request.extra.get("audio_flow_shift")


def _image(frame: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(frame))


def _audio(samples: np.ndarray) -> torch.Tensor:
    """(channels, samples) float32 → the ``(channels, samples)`` tensor H3's references take."""
    return torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))


def _at_rate(
    audio: np.ndarray, rate: int | None, want: int | None
) -> tuple[np.ndarray, int | None]:
    """A soundtrack moved to ``want`` Hz with libswresample (PyAV), so diffusers need not
    resample it (it would need torchaudio); unchanged when the rates agree."""
    if want is None or rate is None or rate == want:
        return audio, rate
    return prepare_audio(audio, rate, rate=want).samples, want


def to_h3_reference(ref: MediaReference, audio_rate: int | None = None) -> Any:
    """One of omniqueue's decoded references as the diffusers dataclass of its modality;
    soundtracks at ``audio_rate`` (the audio VAE's) when given."""
    if ref.kind == "image":
        assert ref.frames is not None
        return MiniMaxH3ImageReference(image=_image(ref.frames))
    if ref.kind == "video":
        assert ref.frames is not None
        audio, rate = None, None
        if ref.audio is not None:
            samples, rate = _at_rate(ref.audio, ref.sample_rate, audio_rate)
            audio = _audio(samples)
        # One uint8 (T, H, W, 3) array, which diffusers' setup step normalises exactly as
        # a list of PIL images (which cost a copy and a conversion of every frame of the
        # clip, and most of its normalisation, before it is cut to the job's frames).
        frames = np.ascontiguousarray(ref.frames, dtype=np.uint8)
        return MiniMaxH3VideoReference(frames=frames, fps=ref.fps, audio=audio, sample_rate=rate)
    assert ref.audio is not None
    samples, rate = _at_rate(ref.audio, ref.sample_rate, audio_rate)
    return MiniMaxH3AudioReference(audio=_audio(samples), sample_rate=rate)


def call_inputs(
    request: GenerationRequest,
    generator: torch.Generator,
    audio_rate: int | None = None,
    steps: StepCount = "sigma_points",
) -> dict[str, Any]:
    """The keyword arguments of ``pipe(...)`` this request stands for (the differential
    tests call diffusers with exactly these); soundtracks moved to ``audio_rate``; the
    request's steps counted as ``steps`` says."""
    inputs: dict[str, Any] = {
        "prompt": request.prompt,
        "height": request.height,
        "width": request.width,
        "num_frames": request.num_frames,
        "num_inference_steps": sigma_points(request.num_inference_steps, steps),
        "generator": generator,
    }
    if request.references:
        inputs["references"] = [to_h3_reference(r, audio_rate) for r in request.references]
    if request.reference_image is not None:
        inputs["image"] = _image(request.reference_image)
    if request.last_image is not None:
        inputs["last_image"] = _image(request.last_image)
    return inputs
