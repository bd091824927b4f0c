"""The shared part of the ``WS /v1/realtime`` state machine (:mod:`realtime.audio_protocol`):
its commands, states and options, and the session state and output queue every handler
works on. The handlers live by noun: :mod:`realtime.audio_turns` (input audio and
conversation items), :mod:`realtime.audio_responses` (responses and the worker's output),
:mod:`realtime.audio_protocol` (dispatch, session, lifecycle, duplex resume)."""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import models.realtime as wire
from realtime.conversation import Conversation, Entry
from realtime.input_audio import InputAudio, VadFactory
from realtime.outbox import ServerEventQueue
from realtime.responses import ResponseRun

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # the session reached max_session_s
CLOSE_INTERNAL = 1011  # worker lost or failed
CLOSE_TRY_AGAIN = 1013  # no worker slot (resource_exhausted)


@dataclass(frozen=True)
class Respond:
    """Generate a response on the worker, answering ``pcm16`` / ``text`` (the user turn)."""

    response_id: str
    pcm16: bytes
    text: str | None
    voice: str
    speed: float
    instructions: str | None


@dataclass(frozen=True)
class Cancel:
    """Stop a response at the next model step (system-class)."""

    response_id: str
    reason: str


@dataclass(frozen=True)
class Stop:
    """End the worker session and free its slot."""

    reason: str


Command = Respond | Cancel | Stop


@dataclass(frozen=True)
class ResumeRequested:
    """For the shell, not the worker: the socket's first event asks to re-attach another,
    detached duplex session. The shell looks it up (this process, or Redis) and either
    resumes that session (:meth:`~realtime.audio_protocol.VoiceSessionProtocol.resume`) and
    drops this one, or answers :meth:`~realtime.audio_protocol.VoiceSessionProtocol.resume_refused`
    here."""

    session_id: str
    resume_token: str
    last_seq: int


class State(enum.Enum):
    OPEN = "open"
    DETACHED = "detached"  # duplex: socket gone, waiting for session.resume
    CLOSED = "closed"


@dataclass
class VoiceSessionOptions:
    model: str
    duplex: bool = False
    max_event_bytes: int = 15 * 1024 * 1024
    max_buffer_bytes: int = 64 * 1024 * 1024
    # Audio kept in the conversation (oldest items lose their audio first).
    max_conversation_audio_bytes: int = 64 * 1024 * 1024
    # Duplex replay log (events), and how long a silent worker may take to confirm a cancel.
    replay_events: int = 8192
    cancel_grace_s: float = 2.0
    # realtime.max_session_s: the session ends (error session_expired) this long after
    # it was created, attached or not; None: no limit
    max_session_s: float | None = None
    # The shell feeds the detector itself (batched with other sessions' input): appends
    # only buffer the audio, and the shell hands the detector's events to ``vad_scored``.
    defer_vad: bool = False


class ProtocolCore:
    """Session state, the output queue and the helpers every handler uses."""

    def __init__(
        self,
        session_id: str,
        options: VoiceSessionOptions,
        vad_factory: VadFactory,
        now: float,
    ) -> None:
        self.id = session_id
        self.options = options
        self.state = State.OPEN
        self.close_code: int | None = None
        self._outbox = ServerEventQueue(duplex=options.duplex, replay_events=options.replay_events)
        self._cmds: list[Command] = []
        # No client frame yet on this socket: a session.resume may name another session.
        self._opening = options.duplex
        self._resume_request: ResumeRequested | None = None
        self.resume_token = secrets.token_urlsafe(24) if options.duplex else None
        self.session = wire.RealtimeSession(
            id=session_id,
            model=options.model,
            capabilities=wire.Capabilities() if options.duplex else None,
            resume_token=self.resume_token,
        )
        self.input = InputAudio(vad_factory, options.defer_vad)
        self._speech_item: str | None = None  # the turn the detector has open
        self._speech_start = 0  # bytes
        self._idle_deadline: float | None = None
        self._expires_at = None if options.max_session_s is None else now + options.max_session_s
        self.conversation = Conversation(options.max_conversation_audio_bytes)
        self.active: ResponseRun | None = None
        self._responses = 0
        self._sync_vad()
        self._emit(wire.SessionCreatedEvent(session=self.session))

    def data_to_send(self) -> list[str]:
        return self._outbox.take()

    def commands(self) -> list[Command]:
        """Commands for the worker; cancels and stops first (system-class)."""
        cmds, self._cmds = self._cmds, []
        return [c for c in cmds if not isinstance(c, Respond)] + [
            c for c in cmds if isinstance(c, Respond)
        ]

    def close_expected(self) -> bool:
        return self.state is State.CLOSED

    @property
    def vad_active(self) -> bool:
        return self.input.vad is not None

    @property
    def last_seq(self) -> int:
        return self._outbox.seq

    def next_deadline(self) -> float | None:
        deadlines = [self._idle_deadline, self._expires_at]
        if self.active is not None:
            deadlines.append(self.active.cancel_deadline)
        live = [d for d in deadlines if d is not None]
        return min(live) if live else None

    def _emit(self, event: wire.ServerEvent) -> None:
        if self.state is State.CLOSED:
            return
        self._outbox.put(event)

    def _error(
        self,
        message: str,
        *,
        code: str = "invalid_value",
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        self._emit(
            wire.ErrorEvent(
                error=wire.RealtimeError(
                    type=type, code=code, message=message, param=param, event_id=event_id
                )
            )
        )

    def _sync_vad(self) -> None:
        self.input.configure(self.session.audio.input.turn_detection)
        if self.input.vad is None:
            self._speech_item = None

    def arm_idle_timeout(self, now: float, audio_ms_left: float = 0.0) -> None:
        td = self.session.audio.input.turn_detection
        if td is not None and td.idle_timeout_ms and self.active is None:
            self._idle_deadline = now + audio_ms_left / 1000 + td.idle_timeout_ms / 1000

    if TYPE_CHECKING:  # declared for the type checker only; no runtime stand-ins
        # Handlers one mixin calls on the other: defined in
        # :class:`realtime.audio_responses.ResponseHandlers` and
        # :class:`realtime.audio_turns.TurnHandlers`, combined in ``VoiceSessionProtocol``.

        def _start_response(self, overrides: wire.ResponseOverrides | None, now: float) -> None: ...

        def _cancel_active(
            self, reason: Literal["turn_detected", "client_cancelled"], now: float
        ) -> None: ...

        def _truncate(self, entry: Entry, index: int, end_ms: int) -> None: ...
