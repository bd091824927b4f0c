"""The conversation of one voice session: ordered items and the audio they hold.

Items keep their PCM16 audio by content index beside the wire item (the wire item
itself never carries audio except in ``conversation.item.retrieved``). The audio kept is
bounded: past ``max_audio_bytes`` the oldest items lose their audio first.
"""

from __future__ import annotations

import base64
import binascii
import collections
from dataclasses import dataclass, field

import models.realtime as wire
from models.errors import ItemError


@dataclass
class Entry:
    item: wire.ConversationItem
    # PCM16 per content index (audio parts only).
    audio: dict[int, bytearray] = field(default_factory=dict)


# Content types each role may carry in a client's conversation.item.create.
_ALLOWED = {
    "user": {"input_text", "input_audio"},
    "system": {"input_text"},
    "assistant": {"output_text", "output_audio", "text", "audio"},
}


def client_entry(item: wire.ConversationItem) -> Entry:
    """Check a client-created item and move its base64 audio out of the wire item (the
    item is changed in place). Raises :class:`ItemError` naming the offending field."""
    audio: dict[int, bytearray] = {}
    if item.type == "message":
        if item.role is None:
            raise ItemError("a message needs a role", "item.role", "missing_required_parameter")
        for i, part in enumerate(item.content):
            if part.type not in _ALLOWED[item.role]:
                raise ItemError(
                    f"content type {part.type!r} is not allowed in a {item.role} message",
                    f"item.content.{i}.type",
                )
            if part.audio is not None:
                try:
                    audio[i] = bytearray(base64.b64decode(part.audio, validate=True))
                except (binascii.Error, ValueError) as exc:
                    raise ItemError("audio is not valid base64", f"item.content.{i}.audio") from exc
                part.audio = None
    elif item.type == "function_call_output":
        if item.call_id is None or item.output is None:
            raise ItemError(
                "function_call_output needs call_id and output",
                "item.call_id",
                "missing_required_parameter",
            )
    else:
        raise ItemError(f"items of type {item.type!r} cannot be created by the client", "item.type")
    return Entry(item, audio)


class Conversation:
    def __init__(self, max_audio_bytes: int) -> None:
        self.max_audio_bytes = max_audio_bytes
        self._items: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self.audio_bytes = 0

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def ids(self) -> list[str]:
        return list(self._items)

    def last_id(self) -> str | None:
        return next(reversed(self._items), None)

    def get(self, item_id: str) -> Entry | None:
        return self._items.get(item_id)

    def add(self, entry: Entry, previous: str | None) -> None:
        """Insert after ``previous`` (None: first, as OpenAI's ``root``)."""
        item_id = entry.item.id
        assert item_id is not None
        self._items[item_id] = entry
        if previous is None:
            self._items.move_to_end(item_id, last=False)
        elif list(self._items)[-2] != previous:
            keys = [k for k in self._items if k != item_id]
            keys.insert(keys.index(previous) + 1, item_id)
            for key in keys:
                self._items.move_to_end(key)
        self.audio_bytes += sum(len(a) for a in entry.audio.values())
        self._trim()

    def append_audio(self, item_id: str, index: int, pcm16: bytes) -> None:
        entry = self._items.get(item_id)
        if entry is not None:
            entry.audio.setdefault(index, bytearray()).extend(pcm16)
            self.audio_bytes += len(pcm16)
            self._trim()

    def delete(self, item_id: str) -> None:
        entry = self._items.pop(item_id)
        self.audio_bytes -= sum(len(a) for a in entry.audio.values())

    def truncate(self, entry: Entry, index: int, end_bytes: int) -> None:
        """Drop audio after ``end_bytes`` and the part's transcript (it may hold words
        the listener never heard)."""
        audio = entry.audio[index]
        self.audio_bytes -= max(len(audio) - end_bytes, 0)
        del audio[end_bytes:]
        entry.item.content[index].transcript = None

    def latest_user_turn(self) -> tuple[bytes, str | None]:
        """The latest user message: its audio and its text."""
        for entry in reversed(self._items.values()):
            if entry.item.role == "user":
                pcm = b"".join(bytes(a) for _, a in sorted(entry.audio.items()))
                texts = [p.text for p in entry.item.content if p.text]
                return pcm, " ".join(texts) if texts else None
        return b"", None

    @staticmethod
    def public(entry: Entry, with_audio: bool = False) -> wire.ConversationItem:
        item = entry.item.model_copy(deep=True)
        if with_audio:
            for index, audio in entry.audio.items():
                if index < len(item.content):
                    item.content[index].audio = base64.b64encode(bytes(audio)).decode()
        return item

    def _trim(self) -> None:
        for entry in self._items.values():
            if self.audio_bytes <= self.max_audio_bytes:
                return
            for audio in entry.audio.values():
                self.audio_bytes -= len(audio)
                audio.clear()
