"""Sans-I/O state machine of one ``WS /v1/realtime/video`` session.

As in the ``websockets`` core: no asyncio, sockets, Redis or clock; the caller owns
them (``now``: any monotonic float, seconds). AWAITING_START →(valid start) STARTING
→``started()`` STREAMING →``finished()`` DONE; ``session.stop`` → STOPPING
→``finished()`` DONE; a bad, late or oversized start, ``failed()``, the stall timeout,
the session time limit (``max_session_s`` after the start) or ``connection_lost()`` →
FAILED. A start whose rollout breaks the model's ``max_frames`` or lasts longer than
``max_session_s`` (``num_frames / fps``) is refused before any command is issued.

In: ``receive_text`` / ``receive_binary`` / ``connection_lost`` (client), ``started`` /
``chunk`` / ``finished`` / ``failed`` (worker relay), ``check_timeouts`` (due at
``next_deadline()``). Out: ``events_received()``, commands for the worker
(``command.system``: interaction and stop are system-class and go ahead of queued
data); ``data_to_send()``, frames in order (``str`` text, ``bytes`` binary);
``close_expected()`` / ``close_code``: close once those frames are sent.

Rules: a ``video.chunk_metadata`` and its binary frame are never split; media indices
run 0, 1, 2… up to ``config.chunks``; the first binary frame starts with ``ftyp``;
nothing follows the trailer; an unstopped rollout ends with exactly ``config.chunks``
media chunks (``session.done.chunks`` = media chunks sent). ``video.start`` is the
first frame of an admitted session: earlier replies (pong, acks, non-fatal errors)
are held until then. Interrupts jump the queue (STYLE rule 5): a stop or fatal error
drops chunk pairs not yet taken by ``data_to_send()``; chunks after a stop are
checked, not sent. An interaction no chunk is left for gets ``error
interaction_too_late`` (with its ``event_id``): at once when every media chunk was
already made, else before ``session.done`` when the rollout ended without starting it
(it reached the worker once the last chunk could take it no more). Any client message
and any worker progress (``started``, ``chunk``) refresh the stall clock, as in
vLLM-Omni. Client mistakes never raise: they become ``error`` events (fatal before the
start, close 1008); an illegal worker-side call raises ``ProtocolError``. Once DONE or
FAILED, input is ignored.

Resume (``docs/protocols/realtime-video.md``): ``video.start`` carries ``session_id`` and
``resume_token``; a session taken over on a new socket is rebuilt with :meth:`restored`,
then :meth:`resume` answers ``session.resumed``, and the worker's outputs are fed again
from the start of its stream: the first media chunk's init segment goes out alone as a
``kind: "init"`` pair, chunks up to the client's last one are counted but not sent, and
the rest follow as usual. :meth:`taken_over` ends the socket a session was resumed away
from (close 1008; the worker goes on).

The commands, states, options and the session's state and output queue are in
:mod:`realtime.video_core` (re-exported here); the rollout a start resolves to is
:func:`models.realtime_video_start.resolve_start`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import TypeAdapter, ValidationError

import models.realtime_video as wire
from models.errors import StartRejected
from models.realtime_video_start import resolve_start
from models.session_bus import ChunkOutput
from realtime.fmp4_split import NotFragmented, split_init
from realtime.json_input import JsonInputError, parse
from realtime.video_core import (
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    Code,
    Command,
    InteractionRequested,
    ProtocolError,
    StartRequested,
    State,
    StopReason,
    StopRequested,
    WorldSessionCore,
    WorldSessionOptions,
)

__all__ = [
    "CLOSE_INTERNAL",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_TRY_AGAIN",
    "Command",
    "InteractionRequested",
    "ProtocolError",
    "StartRequested",
    "State",
    "StopReason",
    "StopRequested",
    "WorldSessionOptions",
    "WorldSessionProtocol",
]


_ALL_MADE = "every chunk of the rollout was already made: no chunk is left for this interaction"
_ENDED_BEFORE = "the rollout ended before this interaction could apply (no chunk was left)"

_LIVE = (State.STARTING, State.STREAMING, State.STOPPING)
_ENDED = (State.DONE, State.FAILED)


_CLIENT_EVENT: TypeAdapter[wire.ClientEvent] = TypeAdapter(wire.ClientEvent)


class WorldSessionProtocol(WorldSessionCore):
    """One session; ``request_id`` comes from the caller (it keys the bus streams)."""

    @classmethod
    def restored(
        cls,
        request_id: str,
        now: float,
        options: WorldSessionOptions,
        *,
        config: wire.VideoConfig,
        resume_token: str,
        event_ids: Iterable[str],
        default_transition: int | None,
        expires_at: float | None,
        model: str | None = None,
    ) -> WorldSessionProtocol:
        """A streaming session taken over from another socket (or API replica): started,
        nothing sent yet on this socket; call :meth:`resume` next."""
        p = cls(request_id, now, options)
        p.config, p.resume_token = config, resume_token
        p.state = State.STREAMING
        p._video_started = True
        p._event_ids = set(event_ids)
        p._default_transition = default_transition
        p._expires_at = expires_at
        p.model = model
        return p

    def resume(self, last_generation_chunk_index: int) -> None:
        """``session.resumed``; then feed the worker's outputs from the start of its stream
        (``started`` again is ignored): the init segment, then the chunks after
        ``last_generation_chunk_index`` go out."""
        self._init_pending = True
        self._skip_through = last_generation_chunk_index
        resumed = wire.SessionResumed(
            request_id=self.request_id,
            session_id=self.request_id,
            next_generation_chunk_index=last_generation_chunk_index + 1,
        )
        self._out.append(((resumed.to_json(),), None))

    def resume_refused(self) -> None:
        """``session.resume`` named no session this client may resume: close 1008."""
        self._fatal(Code.SESSION_NOT_FOUND, "no resumable session with that id and token")

    def taken_over(self) -> None:
        """The session was resumed on another socket: end this one (close 1008), without
        a stop for the worker."""
        if self.state not in _ENDED:
            self._fatal(Code.SESSION_TAKEN_OVER, "the session was resumed on another connection")

    def next_deadline(self) -> float | None:
        """When ``check_timeouts`` may next fire; None once the session has ended."""
        if self.state is State.AWAITING_START:
            return self._opened_at + self.options.start_timeout
        if self.state in _LIVE:
            stall = self._last_activity + self.options.stall_timeout
            return stall if self._expires_at is None else min(stall, self._expires_at)
        return None

    def receive_text(self, data: str | bytes, now: float) -> None:
        """A text frame from the client (``bytes``: its UTF-8 encoding)."""
        if self.state in _ENDED:
            return
        self._last_activity = now
        awaiting = self.state is State.AWAITING_START
        cap = self.options.max_start_bytes if awaiting else self.options.max_control_bytes
        size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "replace"))
        reject: Callable[..., None] = self._fatal if awaiting else self._error
        if size > cap:
            return reject(Code.MESSAGE_TOO_LARGE, f"message larger than {cap} bytes")
        try:
            message = parse(data)
        except JsonInputError as exc:
            return reject(Code.INVALID_JSON, exc.message, param=exc.param)
        if not isinstance(message, dict):
            return reject(Code.INVALID_JSON, "messages must be JSON objects")
        kind = message.get("type")
        if awaiting and kind == "session.start":
            return self._start(message, now)
        if awaiting:
            return self._fatal(Code.SESSION_START_REQUIRED, f"Expected session.start, got: {kind}")
        if kind not in wire.CLIENT_EVENT_TYPES:
            return self._error(Code.UNKNOWN_EVENT, f"Unknown message type: {kind}")
        if kind == "session.start":
            return self._error(Code.INVALID_STATE, "session.start was already received")
        try:
            event = _CLIENT_EVENT.validate_python(message)
        except ValidationError as exc:
            interaction = kind == "session.interaction"
            code = Code.INVALID_INTERACTION if interaction else Code.INVALID_EVENT
            return self._error(code, f"Invalid {kind}: {wire.describe_error(exc)}")
        if isinstance(event, wire.SessionInteraction):
            self._interaction(event)
        elif isinstance(event, wire.SessionPing):
            self._reply(wire.SessionPong())
        elif isinstance(event, wire.SessionStop) and self.state is not State.STOPPING:
            self.state = State.STOPPING
            self._commands.append(StopRequested("client"))
            self._drop_data()

    def receive_binary(self, data: bytes, now: float) -> None:
        """A binary frame from the client: not part of this protocol."""
        if self.state in _ENDED:
            return
        self._last_activity = now
        if self.state is State.AWAITING_START:
            return self._fatal(Code.SESSION_START_REQUIRED, "Expected session.start, got binary")
        self._error(Code.BINARY_NOT_SUPPORTED, "binary frames are not accepted")

    def connection_lost(self) -> None:
        """The client went away: a worker is told to stop; nothing more is sent."""
        if self.state in (State.STARTING, State.STREAMING):
            self._commands.append(StopRequested("disconnected"))
        if self.state not in _ENDED:
            self.state = State.FAILED
            self._out.clear()
            self._held.clear()

    def started(self, *, now: float, config: wire.VideoConfig | None = None) -> None:
        """A worker admitted the session; ``config``: its resolved rollout, if different."""
        if self.state in _ENDED or (self._init_pending and self._video_started):
            return  # ended, or a resumed session seeing its start again
        if self.state not in (State.STARTING, State.STOPPING) or self._video_started:
            raise ProtocolError(f"started() in state {self.state.name}")
        self.config = config or self.config
        assert self.config is not None
        self._last_activity = now
        self._video_started = True
        if self.state is State.STARTING:
            self.state = State.STREAMING
        start = wire.VideoStart(
            request_id=self.request_id,
            config=self.config,
            session_id=self.request_id,
            resume_token=self.resume_token,
        )
        self._out.append(((start.to_json(),), None))
        self._flush_held()

    def chunk(self, output: ChunkOutput, data: bytes, *, now: float) -> None:
        """One encoded fMP4 fragment (the worker's ``chunk`` output and its bytes) → its
        ``video.chunk_metadata`` and binary frame."""
        kind, generation_chunk_index = output.kind, output.generation_chunk_index
        num_frames = output.num_frames
        if self.state in _ENDED:
            return
        if self.state not in (State.STREAMING, State.STOPPING) or not self._video_started:
            raise ProtocolError(f"chunk() in state {self.state.name}")
        assert self.config is not None
        if not data or self._trailer_seen:
            raise ProtocolError("a chunk is not empty and nothing follows the trailer")
        if kind == "media":
            if generation_chunk_index != self._next_index:
                raise ProtocolError(f"chunk {generation_chunk_index}, not {self._next_index}")
            if self._next_index >= self.config.chunks or num_frames < 1:
                raise ProtocolError(f"beyond {self.config.chunks} chunks, or no frames")
            self._next_index += 1
            started = set(output.started_event_ids)
            self._pending = [e for e in self._pending if e not in started]
        elif kind == "trailer" and generation_chunk_index is None and num_frames == 0:
            self._trailer_seen = True
        else:
            raise ProtocolError(f"bad {kind!r} chunk (a trailer has no index, no frames)")
        self._last_activity = now
        if self.state is State.STOPPING:
            return  # data-class output after an interrupt is dropped
        if self._init_pending:  # resumed: the init segment first, alone
            if generation_chunk_index != 0:
                raise ProtocolError("a resumed session is fed from its first chunk")
            try:
                init, data = split_init(data)
            except NotFragmented as exc:
                raise ProtocolError(str(exc)) from exc
            self._init_pending = False
            self._send_chunk("init", init, output.produced_at)
            self._flush_held()
        index = generation_chunk_index
        if kind == "media" and index is not None and index <= self._skip_through:
            self.chunks_sent += 1  # the client has it
            return
        if self._transport_index == 0 and data[4:8] != b"ftyp":
            raise ProtocolError("the first binary frame must begin with the ftyp box")
        self._send_chunk(kind, data, output.produced_at, output)

    def finished(self, *, stopped: bool, artifact_id: str | None = None) -> None:
        """The worker ended the rollout (``stopped``: before its last chunk)."""
        if self.state in _ENDED:
            return
        if self.state not in (State.STREAMING, State.STOPPING):
            raise ProtocolError(f"finished() in state {self.state.name}")
        assert self.config is not None
        stopped = stopped or self.state is State.STOPPING
        if not stopped and self._next_index != self.config.chunks:
            raise ProtocolError(f"finished after {self._next_index}/{self.config.chunks} chunks")
        self._flush_held()
        if not stopped:
            for event_id in self._pending:  # they reached the worker during the last chunk
                self._error(Code.INTERACTION_TOO_LATE, _ENDED_BEFORE, event_id)
        self._pending.clear()
        done = wire.SessionDone(
            request_id=self.request_id, chunks=self.chunks_sent, stopped=stopped
        )
        done.artifact_id = artifact_id
        self._out.append(((done.to_json(),), None))
        self.state = State.DONE
        self.close_code = CLOSE_NORMAL

    def failed(self, code: str, message: str) -> None:
        """The session cannot go on; ``message`` must be safe to show the client."""
        if self.state in _ENDED:
            return
        if self.state is State.AWAITING_START:
            raise ProtocolError("failed() before session.start")
        close = CLOSE_TRY_AGAIN if code == Code.RESOURCE_EXHAUSTED else CLOSE_INTERNAL
        policy = code in (Code.INVALID_REQUEST, Code.INVALID_IMAGE_REFERENCE)
        self._fatal(code, message, CLOSE_POLICY if policy else close)

    def check_timeouts(self, now: float) -> None:
        """Apply the start and stall timeouts at ``now``."""
        if self.state is State.AWAITING_START:
            if now - self._opened_at >= self.options.start_timeout:
                self._fatal(Code.START_TIMEOUT, "Timeout waiting for session.start")
        elif self.state in _LIVE and self._expires_at is not None and now >= self._expires_at:
            if self.state is not State.STOPPING:
                self._commands.append(StopRequested("expired"))
            limit = f"{self.options.max_session_s:g}"
            self._fatal(Code.SESSION_EXPIRED, f"the session reached its {limit} s time limit")
        elif self.state in _LIVE and now - self._last_activity >= self.options.stall_timeout:
            if self.state is not State.STOPPING:
                self._commands.append(StopRequested("stalled"))
            self._fatal(Code.STALLED, "Stall timeout: no message and no progress", CLOSE_INTERNAL)

    def _start(self, message: dict[str, Any], now: float) -> None:
        o = self.options
        try:
            start, config = resolve_start(message, o)
        except StartRejected as exc:
            return self._fatal(exc.code, exc.message, param=exc.param)
        self.config = config
        self.model = start.model or o.default_model
        self._default_transition = start.extra_params.transition_chunks
        self.state = State.STARTING
        self._last_activity = now
        if o.max_session_s is not None:
            self._expires_at = now + o.max_session_s
        self._commands.append(StartRequested(start, config))

    def _interaction(self, message: wire.SessionInteraction) -> None:
        interaction = message.interaction
        prompt, camera = interaction.event.prompt, interaction.event.camera
        event_id = interaction.event_id or self._new_event_id()
        if self.state is State.STOPPING:
            return self._error(Code.INVALID_STATE, "the session is stopping", event_id)
        if event_id in self._event_ids:
            return self._error(Code.EVENT_ID_CONFLICT, "event_id_conflict", event_id)
        if self.config is not None and self._next_index >= self.config.chunks:
            return self._error(Code.INTERACTION_TOO_LATE, _ALL_MADE, event_id)
        limits = self.options.model_limits.get(self.model or "")
        if camera is not None and limits is not None and not limits.camera_control:
            detail = f"{self.model} takes no camera actions: it has no camera conditioning"
            param = "interaction.event.camera"
            return self._error(Code.INVALID_REQUEST, detail, event_id, param=param)
        self._event_ids.add(event_id)
        self._pending.append(event_id)
        transition = interaction.transition_chunks
        transition = self._default_transition if transition is None else transition
        self._commands.append(InteractionRequested(event_id, prompt, camera, transition))
        self._reply(wire.SessionInteractionQueued(request_id=self.request_id, event_id=event_id))
