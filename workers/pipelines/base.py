"""The pipeline adapter interface the step executor drives.

An adapter is loaded once per worker process and shared by every job it runs, so all
per-request state (latents, scheduler copy, RNG, embeddings) lives in the state object
returned by :meth:`Pipeline.prepare`, never on the adapter. The executor owns the loop:

    state = pipe.prepare(request)
    while state.step_index < state.num_steps:
        pipe.step(state)          # exactly one denoise step; advances state.step_index
        ...                       # executor: cancel check, progress, deadline, preview
    media = pipe.decode(state)
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.catalog import ModelSpec

# Set by the executor around a long call (prepare, decode); adapters call ``checkpoint()``.
_checkpoint: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "omniq_checkpoint", default=None
)


def checkpoint() -> None:
    """A point inside a long adapter call where the job may stop (cancel, deadline).

    Adapters call it between the pieces of ``prepare`` and ``decode`` (render chunks, VAE
    blocks, text-encoder layers), so a cancel need not wait out the whole call. It raises
    the executor's stop exception when the job is no longer to run, and does nothing
    outside a job (tests, sessions)."""
    check = _checkpoint.get()
    if check is not None:
        check()


@contextlib.contextmanager
def checkpoints(check: Callable[[], None]) -> Iterator[None]:
    """Make ``checkpoint()`` call ``check`` in this context (the executor's job thread)."""
    token = _checkpoint.set(check)
    try:
        yield
    finally:
        _checkpoint.reset(token)


@dataclass
class GenerationRequest:
    """A validated, normalized request as the worker sees it."""

    prompt: str
    width: int
    height: int
    num_frames: int
    fps: float
    num_inference_steps: int
    seed: int
    negative_prompt: str | None = None
    guidance_scale: float | None = None
    # Declared optional parameters (guidance_scale_2, flow_shift, vae_use_tiling, …).
    options: dict[str, Any] = field(default_factory=dict)
    # First frame for image-to-video: uint8 H×W×3 (already resized to width×height).
    reference_image: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepState:
    """Base of every per-request state; adapters subclass it."""

    num_steps: int
    step_index: int = 0

    @property
    def done(self) -> bool:
        return self.step_index >= self.num_steps


@dataclass
class Media:
    """Decoded output: frames uint8 T×H×W×3, optional float32 audio (channels, samples)."""

    frames: np.ndarray
    fps: float
    audio: np.ndarray | None = None
    sample_rate: int | None = None


class Pipeline(abc.ABC):
    """A diffusion pipeline run one denoise step at a time."""

    spec: ModelSpec

    @abc.abstractmethod
    def load(self, device: str) -> None:
        """Load weights onto ``device`` (called once per worker process)."""

    @abc.abstractmethod
    def prepare(self, request: GenerationRequest) -> StepState:
        """Encode the prompt, draw the initial noise; return the per-request state."""

    @abc.abstractmethod
    def step(self, state: StepState) -> None:
        """Run exactly one denoise step and advance ``state.step_index``."""

    @abc.abstractmethod
    def decode(self, state: StepState) -> Media:
        """Turn the final latents into frames (and audio)."""

    def preview(self, state: StepState) -> np.ndarray | None:
        """A cheap uint8 H×W×3 estimate of the current result, or None."""
        return None
