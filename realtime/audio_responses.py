"""Responses of a ``WS /v1/realtime`` session: ``response.create`` / ``response.cancel``,
``output_audio_buffer.clear``, and the worker's audio, end and failure relayed to the
client (part of :class:`realtime.audio_protocol.VoiceSessionProtocol`)."""

from __future__ import annotations

import base64
from typing import Any, Literal

import models.realtime as wire
from realtime.audio_core import (
    CLOSE_INTERNAL,
    CLOSE_TRY_AGAIN,
    Cancel,
    ProtocolCore,
    Respond,
    State,
)
from realtime.conversation import Entry
from realtime.input_audio import BYTES_PER_MS
from realtime.outbox import new_id
from realtime.responses import ResponseRun, final_status, usage


class ResponseHandlers(ProtocolCore):
    """One response at a time, from request to ``response.done``."""

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
