"""Sans-I/O state machine of one ``WS /v1/realtime`` session (OpenAI Realtime GA, plus
the duplex extension of ``docs/protocols/realtime-audio.md``).

As in the ``websockets`` core: no asyncio, sockets, Redis or clock; the caller owns
them (``now``: any monotonic float, seconds). The voice-activity detector is injected
(``vad_factory``), so the tests drive the machine with scripted detectors.

In: ``receive_text`` (client frames), ``worker_audio`` / ``worker_finished`` /
``worker_failed`` (the relay of the worker's outputs),
``check_timeouts`` (due at ``next_deadline()``: the cancel grace, the idle timeout and
the session time limit ``max_session_s``), ``connection_lost`` and, in duplex
sessions, ``resume`` / ``resume_refused``. Out: ``commands()`` for the worker
(``Respond``, ``Cancel``, ``Stop``); ``resume_requested()`` for the shell;
``data_to_send()``, JSON text frames in order; ``close_expected()`` / ``close_code``.

States and transitions (client events are handled in ``OPEN`` only, through the table
:data:`HANDLERS` at the end of this module; frames that arrive in another state are
dropped)::

    OPEN     --session.close, close()-------------------------------> CLOSED (1000)
    OPEN     --connection_lost(), duplex-----------------------------> DETACHED
    OPEN     --connection_lost(), not duplex-------------------------> CLOSED (1000)
    DETACHED --resume(token, last_seq), events still logged----------> OPEN
    DETACHED --close() (the shell's resume grace ran out)------------> CLOSED (1000)
    any      --max_session_s reached (check_timeouts)----------------> CLOSED (1008)
    any      --release() (another replica took the session over)-----> CLOSED (1008)
    any      --worker_failed(code)------------------------> CLOSED (1013 no slot, else 1011)

``session.resume`` as the first frame of a fresh duplex socket names another session:
the machine changes nothing and hands the shell a :class:`ResumeRequested`; the shell
re-attaches that session (its ``resume``) or calls ``resume_refused`` here
(``session.resync_required``). Any later ``session.resume`` gets that answer at once.

Rules:
- Client mistakes never raise and never close: they become ``error`` events naming the
  ``param`` and change nothing (the state is updated only after a whole event checks).
- One response at a time. ``response.done`` is always emitted, once per response,
  after the worker confirmed the end (or ``cancel_grace_s`` later if it stays silent).
- Interrupts jump the queue (STYLE rule 5): a cancel, a barge-in (speech while a
  response runs and ``interrupt_response``), ``output_audio_buffer.clear`` or a close
  drop every later audio delta of that response at once, before the worker confirms.
- Duplex: every server event carries ``server_event_seq`` and is kept in a bounded
  replay log; ``resume(token, last_seq)`` replays what followed, exactly once and in
  order.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

import models.realtime as wire
from realtime.audio_core import (
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    Cancel,
    Command,
    Respond,
    ResumeRequested,
    State,
    Stop,
    VoiceSessionOptions,
)
from realtime.audio_responses import ResponseHandlers
from realtime.audio_turns import TurnHandlers
from realtime.input_audio import BYTES_PER_MS
from realtime.json_input import JsonInputError, parse
from realtime.outbox import encode, new_id
from realtime.session_config import SessionConfigError, apply_update

__all__ = [
    "CLOSE_INTERNAL",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_TRY_AGAIN",
    "Cancel",
    "Command",
    "Respond",
    "ResumeRequested",
    "State",
    "Stop",
    "VoiceSessionOptions",
    "VoiceSessionProtocol",
]


class VoiceSessionProtocol(TurnHandlers, ResponseHandlers):
    """One session: see the module docstring. A client event goes to its handler in
    :data:`HANDLERS`, defined here or in one of the handler mixins."""

    def receive_text(self, text: str, now: float) -> None:
        if self.state is not State.OPEN:
            return
        try:
            self._dispatch(text, now)
        finally:
            self._opening = False

    def _dispatch(self, text: str, now: float) -> None:
        if len(text) > self.options.max_event_bytes:
            self._error(
                f"event is {len(text)} bytes; the limit is {self.options.max_event_bytes}",
                code="event_too_large",
            )
            return
        try:
            raw = parse(text)
        except JsonInputError as exc:
            self._error(exc.message, code="invalid_json", param=exc.param)
            return
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            self._error(
                "every event needs a string 'type'", code="missing_required_parameter", param="type"
            )
            return
        kind = raw["type"]
        client_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
        cls = wire.CLIENT_EVENTS.get(kind)
        if cls is None or (kind in wire.DUPLEX_ONLY and not self.options.duplex):
            where = " (duplex sessions only: connect with ?duplex=1)" if cls else ""
            self._error(f"unsupported event type {kind!r}{where}", param="type", event_id=client_id)
            return
        try:
            event = cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            param = ".".join(str(p) for p in err["loc"])
            code = "missing_required_parameter" if err["type"] == "missing" else "invalid_value"
            self._error(f"{param}: {err['msg']}", code=code, param=param, event_id=client_id)
            return
        HANDLERS[kind](self, event, now)

    def _on_session_update(self, event: wire.SessionUpdateEvent, now: float) -> None:
        try:
            self.session = apply_update(self.session, event.session, self.options.model)
        except SessionConfigError as exc:
            self._error(exc.message, code=exc.code, param=exc.param, event_id=event.event_id)
            return
        self._sync_vad()
        self._emit(wire.SessionUpdatedEvent(session=self.session))

    def _on_session_heartbeat(self, event: wire.SessionHeartbeatEvent, now: float) -> None:
        self._emit(wire.HeartbeatAckEvent())

    def _on_session_close(self, event: wire.SessionCloseEvent, now: float) -> None:
        self.close(event.reason or "client_closed", now)

    def _on_playback_ack(self, event: wire.PlaybackAckEvent, now: float) -> None:
        active = self.active
        if active is not None and event.response_id in (None, active.id):
            active.played_ms = event.played_ms
        self._emit(
            wire.PlaybackAcknowledgedEvent(
                played_ms=event.played_ms,
                response_id=event.response_id or (active.id if active else None),
                item_id=event.item_id or (active.item_id if active else None),
            )
        )

    def _on_session_resume(self, event: wire.SessionResumeEvent, now: float) -> None:
        if self._opening:  # the socket's first event: the shell looks the session up
            self._resume_request = ResumeRequested(
                event.session_id, event.resume_token, event.last_received_server_event_seq
            )
        else:
            self.resume_refused(event.session_id)

    def resume_requested(self) -> ResumeRequested | None:
        """The resume the last client frame asked for, once; None when there is none."""
        request, self._resume_request = self._resume_request, None
        return request

    def resume_refused(self, session_id: str) -> None:
        """The shell found no session to resume for the :class:`ResumeRequested`."""
        self._emit(
            wire.ResyncRequiredEvent(
                session_id=session_id,
                reason="no resumable session with that id and token (expired or unknown)",
            )
        )

    def detach(self) -> None:
        """Duplex: the socket dropped; keep running and logging until a resume."""
        if self.state is State.OPEN:
            self.state = State.DETACHED

    def resume(self, token: str, last_seq: int) -> bool:
        """Attach a new socket after ``last_seq``: ``session.resumed`` then the missed
        events, exactly once and in order; False (nothing changes) when they are gone."""
        if self.state is State.CLOSED or not secrets.compare_digest(token, self.resume_token or ""):
            return False
        missed = self._outbox.since(last_seq)
        if missed is None:
            return False
        self.state = State.OPEN
        self._opening = False  # attached by this resume: no other session to ask for
        resumed = wire.SessionResumedEvent(
            session_id=self.id, replayed=len(missed), last_server_event_seq=self._outbox.seq
        )
        resumed.event_id = new_id("event_")  # outside the numbering: it is not replayed
        self._outbox.restart([encode(resumed), *missed])
        return True

    def release(self) -> None:
        """Another API replica took the session over: end here, without a word to the
        worker (it goes on serving the session for that replica)."""
        if self.state is not State.CLOSED:
            self._error("the session was resumed on another connection", code="session_taken_over")
            self._cmds.clear()
            self.state = State.CLOSED
            self.close_code = CLOSE_POLICY

    def journal(self) -> list[tuple[int, str]]:
        """Duplex: the ``(server_event_seq, frame)`` pairs emitted since the last call; the
        shell stores them (``api/realtime/voice_state.py``) before sending ``data_to_send()``."""
        return self._outbox.take_journal()

    def check_timeouts(self, now: float) -> None:
        if self._expires_at is not None and now >= self._expires_at:
            self._expire(now)
            return
        active = self.active
        deadline = active.cancel_deadline if active is not None else None
        if deadline is not None and now >= deadline:
            self._finish("cancelled")
        if self._idle_deadline is not None and now >= self._idle_deadline:
            self._idle_deadline = None
            self._idle_timeout(now)

    def _idle_timeout(self, now: float) -> None:
        if self.active is not None or self._speech_item is not None:
            return
        item_id = new_id("item_")
        at = self.input.position // BYTES_PER_MS
        self._emit(wire.TimeoutTriggeredEvent(audio_start_ms=at, audio_end_ms=at, item_id=item_id))
        self._commit_audio(self.input.take(), item_id)
        self._start_response(None, now)

    def _expire(self, now: float) -> None:
        """The session reached ``max_session_s``: ``error session_expired``, close 1008."""
        if self.state is State.CLOSED:
            return
        if self.active is not None:
            self._cancel_active("client_cancelled", now)
            self._finish("cancelled")
        limit = f"{self.options.max_session_s:g}"
        self._error(f"the session reached its {limit} s time limit", code="session_expired")
        self._cmds.append(Stop("expired"))
        self.state = State.CLOSED
        self.close_code = CLOSE_POLICY

    def close(self, reason: str, now: float) -> None:
        """End the session (client ``session.close``, disconnect, grace expiry)."""
        if self.state is State.CLOSED:
            return
        if self.active is not None:
            self._cancel_active("client_cancelled", now)
            self._finish("cancelled")
        if self.options.duplex:
            self._emit(wire.SessionClosedEvent(reason=reason))
        self._cmds.append(Stop(reason))
        self.state = State.CLOSED
        self.close_code = CLOSE_NORMAL

    def connection_lost(self, now: float) -> None:
        if self.options.duplex and self.state is State.OPEN:
            self.detach()
        else:
            self.close("disconnected", now)


Handler = Callable[[VoiceSessionProtocol, Any, float], None]

# Every client event and its handler (``wire.CLIENT_EVENTS`` has exactly these types;
# tests/unit/test_realtime_dispatch.py checks it). Handlers never raise: a client mistake
# becomes an ``error`` event. The state changes they make are drawn in the module docstring.
HANDLERS: dict[str, Handler] = {
    # session (this module)
    "session.update": VoiceSessionProtocol._on_session_update,
    "session.heartbeat": VoiceSessionProtocol._on_session_heartbeat,  # duplex
    "session.close": VoiceSessionProtocol._on_session_close,  # duplex; → CLOSED
    "session.resume": VoiceSessionProtocol._on_session_resume,  # duplex; → ResumeRequested
    "playback.ack": VoiceSessionProtocol._on_playback_ack,  # duplex
    # input audio and conversation items (realtime/audio_turns.py)
    "input_audio_buffer.append": VoiceSessionProtocol._on_input_audio_buffer_append,
    "input_audio_buffer.commit": VoiceSessionProtocol._on_input_audio_buffer_commit,
    "input_audio_buffer.clear": VoiceSessionProtocol._on_input_audio_buffer_clear,
    "conversation.item.create": VoiceSessionProtocol._on_conversation_item_create,
    "conversation.item.retrieve": VoiceSessionProtocol._on_conversation_item_retrieve,
    "conversation.item.delete": VoiceSessionProtocol._on_conversation_item_delete,
    "conversation.item.truncate": VoiceSessionProtocol._on_conversation_item_truncate,
    # responses (realtime/audio_responses.py); response.create queues a Respond command
    "response.create": VoiceSessionProtocol._on_response_create,
    "response.cancel": VoiceSessionProtocol._on_response_cancel,  # system-class: Cancel first
    "output_audio_buffer.clear": VoiceSessionProtocol._on_output_audio_buffer_clear,
}
