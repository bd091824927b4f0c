"""Realtime voice sessions (``WS /v1/realtime``) on a worker: one thread per session slot.

The API owns the client socket, the OpenAI Realtime protocol and the VAD; the worker owns
the voice model and answers turns. They talk over the session's two Redis Streams
(``models/session_bus.py``):

    in  (API → worker): keepalive; respond {response_id, turn} (+ the turn's PCM16 as data);
                        cancel {response_id, reason}; stop
    out (worker → API): accepted {worker_id}; keepalive; audio {response_id, produced_at,
                        text} (+ one wake-up's PCM16); response_finished {response_id,
                        status, audio_ms, transcript}; failed {code, message}; finished

``workers/sessions/slot.py`` holds what both session kinds share: the slot's life
(abandoned, accepted, failed) and the keep-alive clocks.

One response runs at a time (a respond that arrives while one runs waits its turn). Before
every wake-up's steps (and between two steps of a model slower than real time) the runner
drains *all* pending commands, so a cancel or stop is handled ahead of further audio
(docs/architecture.md, rule 16): the cancelled response ends at once
with ``response_finished`` ``cancelled``. Output is paced to real time: at most
``realtime.audio_lead_ms`` of audio ahead of the wall clock since the response started;
the first ``realtime.audio_prebuffer_ms`` go out in one burst, and after them each wake-up
makes ``realtime.audio_chunk_ms`` (its steps back to back, one send). The runner waits on the
inbox itself (``XREAD BLOCK`` until the next step is due, or the next keep-alive when
idle), so a command that arrives during a wait is seen at once, and a session thread
wakes only when it has work. ``stop``, or no command nor keep-alive from the API for
``realtime.lost_after_s``, ends the session with ``finished`` and frees the slot.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from models.errors import InvalidJobInput
from models.session_bus import (
    CancelCommand,
    FinishedOutput,
    RespondCommand,
    ResponseAudioOutput,
    ResponseFinishedOutput,
    SessionCommand,
    StopCommand,
    VoiceSessionConfig,
)
from storage.bus import BusMessage
from workers.pipelines.base import VoicePipeline, VoiceTurn
from workers.sessions.slot import SessionSlot, SlotRunner

# Longest inbox wait of an idle session (the keep-alive still goes out on time).
IDLE_BLOCK_MS = 250
DRAIN_COUNT = 100


@dataclass
class _Response:
    id: str
    turn: VoiceTurn
    state: Any = None
    started: float = 0.0  # monotonic time of its first step
    samples: int = 0  # made so far
    published: int = 0  # samples sent to the API
    transcript: list[str] = field(default_factory=list)
    # The first audio waits here until ``audio_prebuffer_ms`` is made, then goes in one burst.
    held: list[tuple[ResponseAudioOutput, bytes | None]] = field(default_factory=list)
    released: bool = False


class _Stop(Exception):
    """The session ends: stop command or the API fell silent."""


class VoiceSessionRunner(SlotRunner[VoiceSessionConfig]):
    """Voice sessions of one worker process. Their model calls (``start_response``,
    ``step``) take turns on one lock: numpy (and torch) release the GIL inside every
    array operation, so 20 session threads stepping at once handed the GIL back and forth
    ~25,000 times a second, and the context switches cost more CPU than the steps. Taking
    turns, a step runs with nobody else waiting for the GIL; a real device runs one step
    at a time anyway."""

    label = "voice session"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compute = threading.Lock()

    def serve(self, slot: SessionSlot, config: VoiceSessionConfig) -> str:
        session = _VoiceSession(self, slot)
        try:
            return session.serve(config)
        except Exception:
            session.fail_active()  # its response_finished goes out before the failed
            raise


class _VoiceSession:
    """The state of one session while it runs on a slot."""

    def __init__(self, runner: VoiceSessionRunner, slot: SessionSlot) -> None:
        self.slot = slot
        self.settings = runner.settings
        self.pipelines = runner.pipelines
        self.compute = runner.compute
        self.stopping = False
        self.active: _Response | None = None
        self.queued: collections.deque[_Response] = collections.deque()
        self.pipe: VoicePipeline[Any] | None = None

    def serve(self, config: VoiceSessionConfig) -> str:
        pipe = self.pipelines.voice(config.model)
        rate = config.sample_rate
        if rate != pipe.sample_rate:
            raise InvalidJobInput(
                f"sample_rate {rate} is not {pipe.sample_rate}", param="sample_rate"
            )
        self.pipe = pipe
        lead_s = self.settings.realtime.audio_lead_ms / 1000
        try:
            while True:
                wait_ms = self._wait_ms(lead_s)
                self._drain(wait_ms)
                self._tick()
                if self.active is None and self.queued:
                    self._begin(self.queued.popleft())
                active = self.active
                if active is not None and self._ahead_s(active, lead_s) <= 0:
                    self._step(active)
        except _Stop:
            pass
        if self.active is not None:
            self._finish(self.active, "cancelled")
        for queued in self.queued:
            self._finish(queued, "cancelled")
        self.queued.clear()
        self.slot.send(FinishedOutput())
        return "stopped"

    # -- commands -------------------------------------------------------------------------

    def _drain(self, block_ms: int | None) -> None:
        """Read and handle every pending command (blocking up to ``block_ms`` for the first)."""
        while True:
            entries = self.slot.commands(block_ms=block_ms, count=DRAIN_COUNT)
            for entry in entries:
                self._command(entry)
            if self.stopping:
                raise _Stop
            if len(entries) < DRAIN_COUNT:
                return
            block_ms = None

    def _command(self, entry: BusMessage[SessionCommand]) -> None:
        cmd = entry.event
        if isinstance(cmd, StopCommand):
            self.stopping = True
        elif isinstance(cmd, RespondCommand):
            turn = cmd.turn
            self.queued.append(
                _Response(
                    id=cmd.response_id,
                    turn=VoiceTurn(
                        pcm16=entry.data or b"",
                        text=turn.text,
                        voice=turn.voice,
                        speed=turn.speed,
                        instructions=turn.instructions,
                    ),
                )
            )
        elif isinstance(cmd, CancelCommand):
            target = cmd.response_id
            if self.active is not None and self.active.id == target:
                self._finish(self.active, "cancelled")
                self.active = None
            else:
                for queued in list(self.queued):
                    if queued.id == target:
                        self.queued.remove(queued)
                        self._finish(queued, "cancelled")
            # anything else: unknown or already finished, ignored

    def _tick(self) -> None:
        now = time.monotonic()
        if self.slot.api_lost(now):
            raise _Stop
        self.slot.keepalive(now)

    # -- responses ------------------------------------------------------------------------

    def _wait_ms(self, lead_s: float) -> int | None:
        """How long the next inbox read may block: until the next step is due (idle: until
        the next keep-alive, at most ``IDLE_BLOCK_MS``); a step is due → not at all. The
        read returns as soon as a command arrives, so a long wait delays no cancel; few
        wake-ups matter with dozens of session threads sharing one GIL."""
        if self.active is None:
            if self.queued:
                return None
            beat_in = self.slot.next_beat_in(time.monotonic())
            return max(1, min(IDLE_BLOCK_MS, round(beat_in * 1000)))
        ahead = self._ahead_s(self.active, lead_s)
        if ahead <= 0:
            return None
        return max(1, round(ahead * 1000))

    def _ahead_s(self, response: _Response, lead_s: float) -> float:
        """Seconds until the next step is due (audio produced beyond wall clock + lead)."""
        assert self.pipe is not None
        produced = response.samples / self.pipe.sample_rate
        return produced - (time.monotonic() - response.started) - lead_s

    def _begin(self, response: _Response) -> None:
        assert self.pipe is not None
        self.active = response
        with self.compute:
            response.state = self.pipe.start_response(response.turn)
        response.started = time.monotonic()

    def _step(self, response: _Response) -> None:
        """The steps of one wake-up, back to back under the compute lock: until the
        prebuffer is full (the first one), else until ``audio_chunk_ms`` more is made; then
        one send. Commands are read between those steps only after a step that took longer
        than the audio it made (the lock let go meanwhile): a fast model fills its chunk
        without a Redis round trip or a lock hand-off (each one costs a GIL hand-off among
        dozens of session threads), a slow one still sees a cancel within a step."""
        assert self.pipe is not None
        rt, rate = self.settings.realtime, self.pipe.sample_rate
        if response.released:
            until = response.samples + rt.audio_chunk_ms * rate // 1000
        else:
            until = rt.audio_prebuffer_ms * rate // 1000
        slow = False
        with self.compute:
            while True:
                if slow:
                    self.compute.release()  # reading commands is I/O: not under the lock
                    try:
                        self._drain(None)  # a stop raises; a cancel ends the response
                    finally:
                        self.compute.acquire()
                    if self.active is not response:
                        return
                began = time.monotonic()
                chunk = self.pipe.step(response.state)
                slow = time.monotonic() - began > self.pipe.step_ms / 1000
                if chunk.pcm16:
                    response.samples += len(chunk.pcm16) // 2
                    if chunk.text:
                        response.transcript.append(chunk.text)
                    audio = ResponseAudioOutput(
                        response_id=response.id, produced_at=time.time(), text=chunk.text
                    )
                    response.held.append((audio, chunk.pcm16))
                done = self.pipe.done(response.state)
                if response.samples >= until or done:
                    break
        self._release(response)
        if done:
            self._finish(response, "completed")
            self.active = None

    def _release(self, response: _Response) -> None:
        """Send the audio made and not yet sent as one ``audio`` output (one round trip,
        one entry for the API to read): ``produced_at`` of its first step, the text of all."""
        response.released = True
        if not response.held:
            return
        first = response.held[0][0]
        pcm = b"".join(data or b"" for _, data in response.held)
        if len(response.held) > 1:
            text = "".join(audio.text or "" for audio, _ in response.held) or None
            first = first.model_copy(update={"text": text})
        self.slot.send(first, pcm)
        response.published += len(pcm) // 2
        response.held = []

    def _finish(self, response: _Response, status: str) -> None:
        """Report the end; audio still held back (a cancel during the prebuffer) is dropped."""
        rate = self.pipe.sample_rate if self.pipe is not None else 24000
        finished = ResponseFinishedOutput(
            response_id=response.id,
            status=status,
            audio_ms=response.published * 1000 // rate,
            transcript="".join(response.transcript) if response.released else "",
        )
        self.slot.send(finished)

    def fail_active(self) -> None:
        """A response in flight when the session failed ends as ``failed``."""
        if self.active is not None:
            active, self.active = self.active, None
            self._finish(active, "failed")
