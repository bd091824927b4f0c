"""The input side of a voice session: the uncommitted buffer, its position in the
session's input stream, and the voice-activity detector that cuts it into turns.

Positions are byte offsets of PCM16 mono 24 kHz (48 bytes per ms) since the session's first
appended sample. While no turn is open the buffer keeps only what the next turn's prefix
padding may need, so memory stays bounded whatever the client streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import models.realtime as wire

BYTES_PER_MS = wire.SAMPLE_RATE * 2 // 1000


class Detector(Protocol):
    def feed(self, pcm16: bytes) -> list[Any]: ...

    def configure(self, *, threshold: float, silence_duration_ms: int) -> None: ...


VadFactory = Callable[[float, int], Detector]


@dataclass(frozen=True)
class Boundary:
    """A detector event at an input position (bytes)."""

    kind: str  # "speech_started" | "speech_stopped"
    at: int


class InputAudio:
    def __init__(self, vad_factory: VadFactory, defer_vad: bool = False) -> None:
        """``defer_vad``: appends are not fed to the detector here; they collect in
        :meth:`take_unscored` for the caller, which scores them (batched with other
        sessions') and turns the detector's events into boundaries with :meth:`boundaries`."""
        self._vad_factory = vad_factory
        self.defer_vad = defer_vad
        self._unscored = bytearray()
        self.position = 0  # bytes appended this session
        self.buffer = bytearray()
        self.start = 0  # input position of buffer[0]
        self.vad: Detector | None = None
        self._vad_origin = 0  # input position when the detector started

    def configure(self, td: wire.TurnDetection | None) -> None:
        """Follow the session's turn detection: none, a new detector, or new settings."""
        if td is None:
            self.vad = None
        elif self.vad is None:
            self.vad = self._vad_factory(td.threshold, td.silence_duration_ms)
            self._vad_origin = self.position
        else:
            self.vad.configure(threshold=td.threshold, silence_duration_ms=td.silence_duration_ms)

    def append(self, pcm: bytes) -> list[Boundary]:
        """Add audio; the detector's boundaries in it, as input positions."""
        self.buffer += pcm
        self.position += len(pcm)
        if self.vad is None:
            return []
        if self.defer_vad:
            self._unscored += pcm
            return []
        return self.boundaries(self.vad.feed(pcm))

    def boundaries(self, events: list[Any]) -> list[Boundary]:
        """The detector's events as input positions."""
        return [Boundary(e.kind, self._vad_origin + int(e.audio_ms) * BYTES_PER_MS) for e in events]

    def take_unscored(self) -> bytes:
        """Deferred VAD: the audio appended since the last call, for the detector."""
        pcm = bytes(self._unscored)
        self._unscored.clear()
        return pcm

    def take(self, start: int | None = None, end: int | None = None) -> bytes:
        """Remove and return the buffered audio between two input positions (default: all
        of it); audio after ``end`` stays buffered."""
        lo = 0 if start is None else max(start - self.start, 0)
        hi = len(self.buffer) if end is None else max(end - self.start, lo)
        pcm = bytes(self.buffer[lo:hi])
        del self.buffer[:hi]
        self.start += hi
        return pcm

    def keep_last(self, nbytes: int) -> None:
        """Between turns: drop all but the last ``nbytes``."""
        if len(self.buffer) > nbytes:
            self.take(end=self.start + len(self.buffer) - nbytes)
