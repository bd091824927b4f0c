"""The shared part of the ``WS /v1/realtime/video`` state machine
(:mod:`realtime.video_protocol`): its close codes, states, commands for the worker and
options, and the session state and output queue its handlers work on
(:class:`WorldSessionCore`). Sans-I/O like the machine itself: no asyncio, sockets, Redis
or clock."""

from __future__ import annotations

import enum
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from models.errors import OmniqueueError
from models.realtime_video import (
    ChunkKind,
    ErrorEvent,
    SessionInteractionQueued,
    SessionPong,
    SessionStart,
    VideoChunkMetadata,
    VideoConfig,
    VideoErrorCode,
)
from models.realtime_video_chunks import CameraActions
from models.realtime_video_start import StartRules
from models.session_bus import ChunkOutput

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # bad or late session.start, message too big
CLOSE_INTERNAL = 1011  # worker failure, stall, internal error
CLOSE_TRY_AGAIN = 1013  # no worker slot (resource_exhausted)

Code = VideoErrorCode
StopReason = Literal["client", "disconnected", "stalled", "expired"]


class State(enum.Enum):
    AWAITING_START = "awaiting_start"
    STARTING = "starting"  # start accepted, waiting for a worker to admit the session
    STREAMING = "streaming"
    STOPPING = "stopping"  # stop requested, waiting for the worker's finished()
    DONE = "done"
    FAILED = "failed"


class ProtocolError(OmniqueueError):
    """The relay or worker drove the session illegally (a bug, never a client error)."""

    default_code = "internal_error"


@dataclass(frozen=True)
class StartRequested:
    """Admit the session on a worker: ``start`` as sent, ``config`` as resolved."""

    system: ClassVar[bool] = False
    start: SessionStart
    config: VideoConfig


@dataclass(frozen=True)
class InteractionRequested:
    """Apply a prompt/camera change from a later chunk (system-class)."""

    system: ClassVar[bool] = True
    event_id: str
    prompt: str | None
    camera: CameraActions | dict[str, Any] | None
    transition_chunks: int | None  # None: the model's default transition


@dataclass(frozen=True)
class StopRequested:
    """Stop at the next step boundary and release the slot (system-class)."""

    system: ClassVar[bool] = True
    reason: StopReason


Command = StartRequested | InteractionRequested | StopRequested


@dataclass(frozen=True)
class WorldSessionOptions(StartRules):
    """Limits and defaults of a session (the handler fills them from the settings): what
    its ``session.start`` is resolved against, and the socket's own timeouts and caps."""

    start_timeout: float = 10.0
    stall_timeout: float = 60.0
    max_start_bytes: int = 4 * 1024 * 1024
    max_control_bytes: int = 128 * 1024
    # realtime.max_session_s: the longest rollout accepted and the longest live session
    max_session_s: float | None = 600.0


# one or two frames to send; kind set for a chunk pair (data-class: dropped on interrupt)
_Out = tuple[tuple[str | bytes, ...], ChunkKind | None]
_Reply = SessionPong | SessionInteractionQueued | ErrorEvent

# What a chunk's metadata takes from the worker's ChunkOutput as it is (the init segment
# of a resumed session is the API's own: no index, no frames, no events).
_FROM_WORKER = {
    "generation_chunk_index",
    "num_frames",
    "started_event_ids",
    "active_event_ids",
    "completed_event_ids",
}
_INIT_SEGMENT: dict[str, Any] = {"generation_chunk_index": None, "num_frames": 0}


class WorldSessionCore:
    """The state of one session and its output queue: what the client-side and the
    worker-side handlers of :class:`~realtime.video_protocol.WorldSessionProtocol` work
    on. Frames wait in order; a chunk pair is data-class (dropped by an interrupt,
    :meth:`_drop_data`); replies wait until ``video.start`` (or a resumed session's init
    segment) has gone out."""

    def __init__(
        self,
        request_id: str,
        now: float,
        options: WorldSessionOptions | None = None,
        *,
        new_event_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.request_id = request_id
        self.options = options or WorldSessionOptions()
        self.config: VideoConfig | None = None  # set once session.start is accepted
        self.model: str | None = None  # the served model it runs, once started
        self.close_code: int | None = None
        self.chunks_sent = 0  # media chunks handed out (or pending), not dropped
        self.state = State.AWAITING_START
        self._new_event_id = new_event_id
        self._opened_at = self._last_activity = now
        self._expires_at: float | None = None  # set when the start is accepted
        self._video_started = self._trailer_seen = False
        self._next_index = self._transport_index = 0
        self._event_ids: set[str] = set()
        self._pending: list[str] = []  # queued interactions no chunk has started yet
        self._default_transition: int | None = None  # extra_params.transition_chunks
        self._commands: list[Command] = []
        self._out: list[_Out] = []
        self._held: list[_Out] = []
        self.resume_token = secrets.token_urlsafe(24)
        # resumed: the init segment is still to send; media chunks up to this are not sent
        self._init_pending = False
        self._skip_through = -1

    @property
    def event_ids(self) -> list[str]:
        return sorted(self._event_ids)

    @property
    def default_transition(self) -> int | None:
        return self._default_transition

    @property
    def expires_at(self) -> float | None:
        return self._expires_at

    def events_received(self) -> list[Command]:
        """Commands for the worker since the last call, in order."""
        commands, self._commands = self._commands, []
        return commands

    def data_to_send(self) -> list[str | bytes]:
        """Frames to send since the last call: ``str`` as text, ``bytes`` as binary."""
        out, self._out = self._out, []
        return [frame for frames, _ in out for frame in frames]

    def close_expected(self) -> bool:
        """True once the caller should close the socket with ``close_code``."""
        return self.close_code is not None

    def _send_chunk(
        self,
        kind: ChunkKind,
        data: bytes,
        produced_at: float,
        output: ChunkOutput | None = None,
    ) -> None:
        """Queue one metadata + binary pair. The chunk's index, frame count and event ids
        are the worker's ``output`` as it came; the init segment (``output`` None) has no
        index, no frames and no events."""
        from_worker = _INIT_SEGMENT if output is None else output.model_dump(include=_FROM_WORKER)
        metadata = VideoChunkMetadata(
            request_id=self.request_id,
            kind=kind,
            transport_chunk_index=self._transport_index,
            byte_length=len(data),
            produced_at=produced_at,
            **from_worker,
        )
        self._transport_index += 1
        self.chunks_sent += kind == "media"
        self._out.append(((metadata.to_json(), bytes(data)), kind))

    def _reply(self, event: _Reply) -> None:
        """A reply (pong, ack, non-fatal error): held until ``video.start`` went out."""
        ready = self._video_started and not self._init_pending
        (self._out if ready else self._held).append(((event.to_json(),), None))

    def _error(
        self, code: Code, message: str, event_id: str | None = None, *, param: str | None = None
    ) -> None:
        rid = self.request_id
        error = ErrorEvent(
            message=message, code=code, request_id=rid, event_id=event_id, param=param
        )
        self._reply(error)

    def _fatal(
        self,
        code: str,
        message: str,
        close_code: int = CLOSE_POLICY,
        *,
        param: str | None = None,
    ) -> None:
        """End the session with an ``error``: queued chunk pairs are dropped, held replies
        and the error go out, and the socket closes with ``close_code``."""
        request_id = None if self.state is State.AWAITING_START else self.request_id
        self._drop_data()
        self._flush_held()
        error = ErrorEvent(message=message, code=code, request_id=request_id, param=param)
        self._out.append(((error.to_json(),), None))
        self.state = State.FAILED
        self.close_code = close_code

    def _drop_data(self) -> None:
        """An interrupt: chunk pairs not yet taken are dropped (and not counted as sent)."""
        self.chunks_sent -= sum(kind == "media" for _, kind in self._out)
        self._out = [item for item in self._out if item[1] is None]

    def _flush_held(self) -> None:
        self._out.extend(self._held)
        self._held.clear()
