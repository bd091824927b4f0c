"""Sans-I/O state machine of one ``WS /v1/realtime`` session (OpenAI Realtime GA, plus
the duplex extension of ``protocols/realtime-audio.md``).

As in the ``websockets`` core: no asyncio, sockets, Redis or clock; the caller owns
them (``now``: any monotonic float, seconds). The voice-activity detector is injected
(``vad_factory``), so the tests drive the machine with scripted detectors.

In: ``receive_text`` (client frames), ``worker_audio`` / ``worker_finished`` /
``worker_failed`` (the relay of the worker's outputs),
``check_timeouts`` (due at ``next_deadline()``: the cancel grace, the idle timeout and
the session time limit ``max_session_s``), ``connection_lost`` and, in duplex
sessions, ``resume``. Out: ``commands()`` for the worker (``Respond``, ``Cancel``,
``Stop``); ``data_to_send()``, JSON text frames in order; ``close_expected()`` /
``close_code``.

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

import base64
import binascii
import enum
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

import models.realtime as wire
from realtime.conversation import Conversation, Entry, ItemError, client_entry
from realtime.input_audio import BYTES_PER_MS, InputAudio, VadFactory
from realtime.json_input import JsonInputError, parse
from realtime.outbox import Outbox, encode, new_id
from realtime.responses import ResponseRun, final_status, usage
from realtime.session_config import SessionConfigError, apply_update

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


class State(enum.Enum):
    OPEN = "open"
    DETACHED = "detached"  # duplex: socket gone, waiting for session.resume
    CLOSED = "closed"


@dataclass
class RealtimeOptions:
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


class RealtimeProtocol:
    def __init__(
        self,
        session_id: str,
        options: RealtimeOptions,
        vad_factory: VadFactory,
        now: float,
    ) -> None:
        self.id = session_id
        self.options = options
        self.state = State.OPEN
        self.close_code: int | None = None
        self._outbox = Outbox(duplex=options.duplex, replay_events=options.replay_events)
        self._cmds: list[Command] = []
        self.resume_token = secrets.token_urlsafe(24) if options.duplex else None
        self.session = wire.RealtimeSession(
            id=session_id,
            model=options.model,
            capabilities=wire.Capabilities() if options.duplex else None,
            resume_token=self.resume_token,
        )
        self.input = InputAudio(vad_factory)
        self._speech_item: str | None = None  # the turn the detector has open
        self._speech_start = 0  # bytes
        self._idle_deadline: float | None = None
        self._expires_at = None if options.max_session_s is None else now + options.max_session_s
        self.conversation = Conversation(options.max_conversation_audio_bytes)
        self.active: ResponseRun | None = None
        self._responses = 0
        self._sync_vad()
        self._emit(wire.SessionCreatedEvent(session=self.session))

    # ------------------------------------------------------------------ outputs

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

    # ------------------------------------------------------------------ client input

    def receive_text(self, text: str, now: float) -> None:
        if self.state is not State.OPEN:
            return
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
        handler = getattr(self, "_on_" + kind.replace(".", "_"))
        handler(event, now)

    def _on_session_update(self, event: wire.SessionUpdateEvent, now: float) -> None:
        try:
            self.session = apply_update(self.session, event.session, self.options.model)
        except SessionConfigError as exc:
            self._error(exc.message, code=exc.code, param=exc.param, event_id=event.event_id)
            return
        self._sync_vad()
        self._emit(wire.SessionUpdatedEvent(session=self.session))

    def _sync_vad(self) -> None:
        self.input.configure(self.session.audio.input.turn_detection)
        if self.input.vad is None:
            self._speech_item = None

    def _on_input_audio_buffer_append(
        self, event: wire.InputAudioBufferAppendEvent, now: float
    ) -> None:
        try:
            pcm = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError):
            self._error("audio is not valid base64", param="audio", event_id=event.event_id)
            return
        if len(pcm) % 2:
            self._error(
                "audio must be whole PCM16 samples (an even number of bytes)",
                param="audio",
                event_id=event.event_id,
            )
            return
        if len(self.input.buffer) + len(pcm) > self.options.max_buffer_bytes:
            self._error(
                f"the input audio buffer is limited to {self.options.max_buffer_bytes} bytes; "
                "commit or clear it",
                code="input_audio_buffer_full",
                param="audio",
                event_id=event.event_id,
            )
            return
        for boundary in self.input.append(pcm):
            if boundary.kind == "speech_started":
                self._speech_started(boundary.at, now)
            elif boundary.kind == "speech_stopped":
                self._speech_stopped(boundary.at, now)
        td = self.session.audio.input.turn_detection
        if td is not None and self._speech_item is None:
            # Between turns keep only what a next turn's prefix padding may need.
            self.input.keep_last((td.prefix_padding_ms + 1000) * BYTES_PER_MS)

    def _speech_started(self, at: int, now: float) -> None:
        td = self.session.audio.input.turn_detection
        assert td is not None
        self._idle_deadline = None
        self._speech_item = new_id("item_")
        self._speech_start = max(self.input.start, at - td.prefix_padding_ms * BYTES_PER_MS)
        self._emit(
            wire.SpeechStartedEvent(
                audio_start_ms=self._speech_start // BYTES_PER_MS, item_id=self._speech_item
            )
        )
        if self.active is not None and td.interrupt_response:
            self._cancel_active("turn_detected", now)

    def _speech_stopped(self, at: int, now: float) -> None:
        td = self.session.audio.input.turn_detection
        if self._speech_item is None or td is None:
            return
        item_id, self._speech_item = self._speech_item, None
        end = min(self.input.position, at + td.silence_duration_ms * BYTES_PER_MS)
        self._emit(wire.SpeechStoppedEvent(audio_end_ms=end // BYTES_PER_MS, item_id=item_id))
        # The item holds prefix padding, the speech and the silence that ended it; audio
        # after that stays in the buffer for the next turn.
        pcm = self.input.take(self._speech_start, end)
        self._commit_audio(pcm, item_id)
        if td.create_response and self.active is None:
            self._start_response(None, now)

    def _on_input_audio_buffer_commit(
        self, event: wire.InputAudioBufferCommitEvent, now: float
    ) -> None:
        if not self.input.buffer:
            self._error(
                "the input audio buffer is empty: append audio before committing",
                code="input_audio_buffer_commit_empty",
                event_id=event.event_id,
            )
            return
        pcm = self.input.take()
        item_id, self._speech_item = self._speech_item or new_id("item_"), None
        self._commit_audio(pcm, item_id)

    def _commit_audio(self, pcm: bytes, item_id: str) -> None:
        previous = self.conversation.last_id()
        item = wire.ConversationItem(
            id=item_id,
            type="message",
            role="user",
            status="completed",
            content=[wire.ContentPart(type="input_audio", transcript=None)],
        )
        self._emit(wire.InputAudioBufferCommittedEvent(previous_item_id=previous, item_id=item_id))
        self._add_item(Entry(item, {0: bytearray(pcm)}), previous)

    def _on_input_audio_buffer_clear(
        self, event: wire.InputAudioBufferClearEvent, now: float
    ) -> None:
        self.input.take()
        self._speech_item = None
        self._emit(wire.InputAudioBufferClearedEvent())

    # ------------------------------------------------------------------ conversation

    def _add_item(self, entry: Entry, previous: str | None) -> None:
        self.conversation.add(entry, previous)
        shown = Conversation.public(entry)
        self._emit(wire.ItemAddedEvent(previous_item_id=previous, item=shown))
        if entry.item.status != "in_progress":
            self._emit(wire.ItemDoneEvent(previous_item_id=previous, item=shown))

    def _on_conversation_item_create(
        self, event: wire.ConversationItemCreateEvent, now: float
    ) -> None:
        eid, item = event.event_id, event.item.model_copy(deep=True)
        previous = event.previous_item_id
        if previous == "root":
            previous = None
        elif previous is None:
            previous = self.conversation.last_id()
        elif previous not in self.conversation:
            self._error(
                f"no item {previous!r} in the conversation",
                code="item_not_found",
                param="previous_item_id",
                event_id=eid,
            )
            return
        if item.id is not None and item.id in self.conversation:
            self._error(
                f"item {item.id!r} already exists",
                code="item_id_conflict",
                param="item.id",
                event_id=eid,
            )
            return
        try:
            entry = client_entry(item)
        except ItemError as exc:
            self._error(exc.message, code=exc.code, param=exc.param, event_id=eid)
            return
        item.id = item.id or new_id("item_")
        item.status = "completed"
        self._add_item(entry, previous)

    def _find(self, item_id: str, event_id: str | None) -> Entry | None:
        entry = self.conversation.get(item_id)
        if entry is None:
            self._error(
                f"no item {item_id!r} in the conversation",
                code="item_not_found",
                param="item_id",
                event_id=event_id,
            )
        return entry

    def _on_conversation_item_retrieve(
        self, event: wire.ConversationItemRetrieveEvent, now: float
    ) -> None:
        entry = self._find(event.item_id, event.event_id)
        if entry is not None:
            self._emit(wire.ItemRetrievedEvent(item=Conversation.public(entry, with_audio=True)))

    def _on_conversation_item_delete(
        self, event: wire.ConversationItemDeleteEvent, now: float
    ) -> None:
        entry = self._find(event.item_id, event.event_id)
        if entry is None:
            return
        self.conversation.delete(event.item_id)
        self._emit(wire.ItemDeletedEvent(item_id=event.item_id))

    def _on_conversation_item_truncate(
        self, event: wire.ConversationItemTruncateEvent, now: float
    ) -> None:
        eid = event.event_id
        entry = self._find(event.item_id, eid)
        if entry is None:
            return
        if entry.item.role != "assistant" or event.content_index not in entry.audio:
            self._error(
                "only the audio of an assistant message can be truncated",
                param="content_index",
                event_id=eid,
            )
            return
        audio = entry.audio[event.content_index]
        length_ms = len(audio) // BYTES_PER_MS
        if event.audio_end_ms > length_ms:
            self._error(
                f"audio_end_ms {event.audio_end_ms} is past the audio's end ({length_ms} ms)",
                param="audio_end_ms",
                event_id=eid,
            )
            return
        self._truncate(entry, event.content_index, event.audio_end_ms)

    def _truncate(self, entry: Entry, index: int, end_ms: int) -> None:
        self.conversation.truncate(entry, index, end_ms * BYTES_PER_MS)
        if self.active is not None and self.active.item_id == entry.item.id:
            self.active.muted = True
        assert entry.item.id is not None
        self._emit(
            wire.ItemTruncatedEvent(item_id=entry.item.id, content_index=index, audio_end_ms=end_ms)
        )

    # ------------------------------------------------------------------ responses

    def _on_response_create(self, event: wire.ResponseCreateEvent, now: float) -> None:
        if self.active is not None:
            self._error(
                f"response {self.active.id} is still in progress; cancel it or wait for "
                "response.done",
                code="conversation_already_has_active_response",
                event_id=event.event_id,
            )
            return
        overrides = event.response or wire.ResponseOverrides()
        if overrides.output_modalities not in (None, ["audio"]):
            self._error(
                "this model answers with audio: use ['audio']",
                code="unsupported_value",
                param="response.output_modalities",
                event_id=event.event_id,
            )
            return
        if overrides.tools:
            self._error(
                "this model does not call tools",
                code="unsupported_value",
                param="response.tools",
                event_id=event.event_id,
            )
            return
        if overrides.conversation not in ("auto", "none"):
            self._error(
                "conversation must be 'auto' or 'none'",
                param="response.conversation",
                event_id=event.event_id,
            )
            return
        voice = ((overrides.audio or {}).get("output") or {}).get("voice")
        if voice is not None and voice not in wire.VOICES:
            self._error(
                f"unknown voice {voice!r}",
                param="response.audio.output.voice",
                event_id=event.event_id,
            )
            return
        self._start_response(overrides, now)

    def _start_response(self, overrides: wire.ResponseOverrides | None, now: float) -> None:
        overrides = overrides or wire.ResponseOverrides()
        in_conversation = overrides.conversation != "none"
        self._responses += 1
        response = ResponseRun(
            id=new_id("resp_"),
            item_id=new_id("item_"),
            output_index=0,
            in_conversation=in_conversation,
            metadata=overrides.metadata,
            started_at=now,
        )
        self.active = response
        self._idle_deadline = None
        out = self.session.audio.output
        voice = ((overrides.audio or {}).get("output") or {}).get("voice") or out.voice
        self._emit(
            wire.ResponseCreatedEvent(
                response=wire.RealtimeResponse(
                    id=response.id,
                    status="in_progress",
                    metadata=overrides.metadata,
                    conversation_id=self.id if in_conversation else None,
                )
            )
        )
        item = wire.ConversationItem(
            id=response.item_id, role="assistant", status="in_progress", content=[]
        )
        self._emit(wire.OutputItemAddedEvent(response_id=response.id, output_index=0, item=item))
        if in_conversation:
            previous = self.conversation.last_id()
            stored = item.model_copy(deep=True)
            stored.content = [wire.ContentPart(type="output_audio", transcript="")]
            entry = Entry(stored, {0: bytearray()})
            self.conversation.add(entry, previous)
            self._emit(wire.ItemAddedEvent(previous_item_id=previous, item=item))
        self._emit(
            wire.ContentPartAddedEvent(
                **self._ref(response), part=wire.ContentPart(type="audio", transcript="")
            )
        )
        pcm, text = self.conversation.latest_user_turn()
        self._cmds.append(
            Respond(
                response_id=response.id,
                pcm16=pcm,
                text=text,
                voice=voice,
                speed=out.speed,
                instructions=overrides.instructions or self.session.instructions or None,
            )
        )

    @staticmethod
    def _ref(response: ResponseRun) -> dict[str, Any]:
        return {
            "response_id": response.id,
            "item_id": response.item_id,
            "output_index": response.output_index,
            "content_index": 0,
        }

    def _on_response_cancel(self, event: wire.ResponseCancelEvent, now: float) -> None:
        active = self.active
        if active is None or active.cancel_reason is not None:
            self._error(
                "there is no response in progress to cancel",
                code="response_cancel_not_active",
                event_id=event.event_id,
            )
            return
        if event.response_id is not None and event.response_id != active.id:
            self._error(
                f"response {event.response_id!r} is not in progress",
                code="response_cancel_not_active",
                param="response_id",
                event_id=event.event_id,
            )
            return
        self._cancel_active("client_cancelled", now)

    def _cancel_active(
        self, reason: Literal["turn_detected", "client_cancelled"], now: float
    ) -> None:
        active = self.active
        if active is None or active.cancel_reason is not None:
            return
        active.cancel_reason = reason
        active.muted = True
        active.cancel_deadline = now + self.options.cancel_grace_s
        self._cmds.append(Cancel(active.id, reason))

    def _on_output_audio_buffer_clear(
        self, event: wire.OutputAudioBufferClearEvent, now: float
    ) -> None:
        if self.active is None:
            self._error(
                "no response audio is being sent",
                code="response_cancel_not_active",
                event_id=event.event_id,
            )
            return
        self.active.muted = True
        self._emit(wire.OutputAudioBufferClearedEvent(response_id=self.active.id))

    # ------------------------------------------------------------------ duplex

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
        # A resume names another (detached) session: the shell looks it up before
        # handing frames to this machine, so reaching here means there was none.
        self._emit(
            wire.ResyncRequiredEvent(
                session_id=event.session_id,
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
        shell stores them (``realtime/voice_state.py``) before sending ``data_to_send()``."""
        return self._outbox.take_journal()

    # ------------------------------------------------------------------ worker relay

    def worker_audio(
        self, response_id: str, pcm16: bytes, text: str | None, produced_at: float | None
    ) -> None:
        active = self.active
        if active is None or active.id != response_id or active.muted:
            return  # data-class: dropped once the response was interrupted
        ref = self._ref(active)
        if pcm16:
            active.audio_bytes += len(pcm16)
            self.conversation.append_audio(active.item_id, 0, pcm16)
            self._emit(
                wire.AudioDeltaEvent(
                    **ref, delta=base64.b64encode(pcm16).decode(), produced_at=produced_at
                )
            )
        if text:
            active.transcript += text
            self._emit(wire.TranscriptDeltaEvent(**ref, delta=text))

    def worker_finished(
        self, response_id: str, status: str, now: float, message: str | None = None
    ) -> None:
        active = self.active
        if active is None or active.id != response_id:
            return
        self._finish(status, message)
        played_s = now - active.started_at
        self.arm_idle_timeout(now, max(active.audio_bytes / BYTES_PER_MS - played_s * 1000, 0))

    def _finish(self, worker_status: str, message: str | None = None) -> None:
        active = self.active
        assert active is not None
        self.active = None
        status, details = final_status(active, worker_status, message)
        ref = self._ref(active)
        entry = self.conversation.get(active.item_id)
        heard = active.transcript
        if entry is not None and entry.item.content and entry.item.content[0].transcript is None:
            heard = ""  # truncated: the unheard transcript is gone
        part = wire.ContentPart(type="audio", transcript=heard)
        self._emit(wire.AudioDoneEvent(**ref))
        self._emit(wire.TranscriptDoneEvent(**ref, transcript=heard))
        self._emit(wire.ContentPartDoneEvent(**ref, part=part))
        item = wire.ConversationItem(
            id=active.item_id,
            role="assistant",
            status="completed" if status == "completed" else "incomplete",
            content=[wire.ContentPart(type="output_audio", transcript=heard)],
        )
        if entry is not None:
            entry.item = item.model_copy(deep=True)
        self._emit(wire.OutputItemDoneEvent(response_id=active.id, output_index=0, item=item))
        if active.in_conversation:
            self._emit(wire.ItemDoneEvent(item=item))
        self._emit(
            wire.ResponseDoneEvent(
                response=wire.RealtimeResponse(
                    id=active.id,
                    status=status,
                    status_details=details,
                    output=[item],
                    conversation_id=self.id if active.in_conversation else None,
                    metadata=active.metadata,
                    usage=usage(active),
                )
            )
        )
        if (
            active.cancel_reason == "turn_detected"
            and active.played_ms is not None
            and entry is not None
            and 0 in entry.audio
        ):
            # Duplex barge-in: keep in the conversation only what the client played.
            self._truncate(entry, 0, min(active.played_ms, len(entry.audio[0]) // BYTES_PER_MS))

    def worker_failed(self, code: str, message: str) -> None:
        """The session failed on the worker (or no worker took it): end it."""
        if self.state is State.CLOSED:
            return
        if self.active is not None:
            self._finish(code, message)
        error_type = "server_error" if code != "invalid_request" else "invalid_request_error"
        self._error(message, code=code, type=error_type)
        self.state = State.CLOSED
        self.close_code = CLOSE_TRY_AGAIN if code == "resource_exhausted" else CLOSE_INTERNAL

    # ------------------------------------------------------------------ clocks / end

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

    def arm_idle_timeout(self, now: float, audio_ms_left: float = 0.0) -> None:
        td = self.session.audio.input.turn_detection
        if td is not None and td.idle_timeout_ms and self.active is None:
            self._idle_deadline = now + audio_ms_left / 1000 + td.idle_timeout_ms / 1000

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
