"""The voice adapter interface a realtime voice session drives (``workers/voice_sessions.py``).

A voice pipeline answers one user turn at a time with audio produced in small steps, so
that a cancel (barge-in, ``response.cancel``) lands within one step:

    state = pipe.start_response(turn)
    while not pipe.done(state):
        chunk = pipe.step(state)   # step_ms of PCM16 (the last step may be shorter)
        ...                        # runner: drain commands, pace to real time, publish

Like :class:`workers.pipelines.base.Pipeline`, an adapter is loaded once per worker process
and shared by every session; all per-response state lives in the state object.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from models.catalog import ModelSpec

VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")


@dataclass
class VoiceTurn:
    """The user turn a response answers."""

    pcm16: bytes  # the user's audio of that turn (PCM16 LE mono at the pipeline's rate), or b""
    text: str | None  # the user's text (input_text), if any
    voice: str  # OpenAI voice name
    speed: float  # 0.25-1.5
    instructions: str | None


@dataclass
class VoiceChunk:
    """One step of a response: its audio and, when a word starts in it, transcript text."""

    pcm16: bytes
    text: str | None = None


class VoicePipeline(abc.ABC):
    """A voice model run one audio step at a time."""

    spec: ModelSpec
    sample_rate: int = 24000
    step_ms: int = 40

    @abc.abstractmethod
    def load(self, device: str) -> None:
        """Load weights onto ``device`` (called once per worker process)."""

    @abc.abstractmethod
    def start_response(self, turn: VoiceTurn) -> Any:
        """Plan the answer to ``turn``; return the per-response state."""

    @abc.abstractmethod
    def step(self, state: Any) -> VoiceChunk:
        """Produce the next ``step_ms`` of audio (+ transcript delta)."""

    @abc.abstractmethod
    def done(self, state: Any) -> bool:
        """Whether the response has no more audio."""
