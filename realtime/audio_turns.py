"""Input audio and conversation items of a ``WS /v1/realtime`` session: the
``input_audio_buffer.*`` and ``conversation.item.*`` handlers, and the turns server VAD
opens and closes (part of :class:`realtime.audio_protocol.VoiceSessionProtocol`)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import models.realtime as wire
from realtime.audio_core import ProtocolCore
from realtime.conversation import Conversation, Entry, ItemError, client_entry
from realtime.input_audio import BYTES_PER_MS, Boundary
from realtime.outbox import new_id


class TurnHandlers(ProtocolCore):
    """What the client says: audio in, turns, conversation items."""

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
        boundaries = self.input.append(pcm)
        if self.input.defer_vad and self.input.vad is not None:
            return  # the shell feeds the detector, then calls vad_scored
        self._turn_boundaries(boundaries, now)

    def vad_scored(self, events: list[Any], now: float) -> None:
        """Deferred VAD (``VoiceSessionOptions.defer_vad``): the detector's events for the
        audio of :meth:`InputAudio.take_unscored`."""
        self._turn_boundaries(self.input.boundaries(events), now)

    def _turn_boundaries(self, boundaries: list[Boundary], now: float) -> None:
        for boundary in boundaries:
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
