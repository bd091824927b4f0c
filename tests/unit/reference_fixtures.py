"""The weightless reference pipelines as their tests use them: loaded on the CPU, and a
tiny ``reference/video`` request (64x48, 8 frames at 8 fps, 4 steps) to vary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from workers.pipelines.base import GenerationRequest

PROMPT = "a red ball bouncing over a blue ocean at sunset"


class _Loadable(Protocol):
    def load(self, device: str) -> None: ...


P = TypeVar("P", bound=_Loadable)


def loaded(make: Callable[[], P]) -> P:
    """A new pipeline from ``make()``, loaded on the CPU (no weights: cheap)."""
    pipe = make()
    pipe.load("cpu")
    return pipe


def video_request(**overrides: Any) -> GenerationRequest:
    """The tiny request with ``overrides`` in place of its fields."""
    fields: dict[str, Any] = {
        "prompt": PROMPT, "width": 64, "height": 48, "num_frames": 8, "fps": 8.0,
        "num_inference_steps": 4, "seed": 7,
    }
    return GenerationRequest.video(**fields | overrides)
