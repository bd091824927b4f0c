"""What a pipeline decodes: a whole :class:`Media` (frames and soundtrack), or a
:class:`DecodeStream` of chunks. The encoders of this folder take them; the adapters of
``workers/pipelines`` make them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass
class Media:
    """Decoded output: frames uint8 T×H×W×3, optional float32 audio (channels, samples)."""

    frames: np.ndarray
    fps: float
    audio: np.ndarray | None = None
    sample_rate: int | None = None

    @classmethod
    def audio_only(cls, audio: np.ndarray, sample_rate: int, fps: float = 0.0) -> Media:
        """The output of an audio model: ``audio`` at ``sample_rate`` and no frames (shape
        0×0×0×3)."""
        frames = np.zeros((0, 0, 0, 3), dtype=np.uint8)
        return cls(frames=frames, fps=fps, audio=audio, sample_rate=sample_rate)


@dataclass
class DecodeStream:
    """A video decoded chunk by chunk (``SupportsDecodeStream.decode_stream``): ``chunks`` yields
    uint8 T×H×W×3 in order, each as soon as it is decoded, as a numpy array or as a torch
    tensor left on the device that decoded it (the encoder's pixel format is then made
    there: ``workers.media.mp4.decode_streamed``); ``audio`` (float32 (channels, samples) at
    ``sample_rate``) is its soundtrack, decoded before the first chunk so the writer
    interleaves it with the frames."""

    chunks: Iterator[np.ndarray | torch.Tensor]
    audio: np.ndarray | None = None
    sample_rate: int | None = None


@runtime_checkable
class SupportsDecodeStream(Protocol):
    """A job adapter that decodes chunk by chunk: the executor encodes one chunk while the
    next decodes, the soundtrack first (:func:`workers.media.mp4.decode_streamed`). A
    capability of ``workers/pipelines/base.py``'s adapters, declared here, below them, so
    that the encoder can name it."""

    def decode_stream(self, state: Any) -> DecodeStream | None:
        """What ``decode`` makes, as a :class:`DecodeStream`; None where this job cannot
        stream (the executor then calls ``decode``)."""
        ...
