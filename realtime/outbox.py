"""Server events of a voice session on their way out: ids, JSON encoding, and in
duplex sessions the ``server_event_seq`` numbering and the bounded replay log that
``session.resume`` draws from."""

from __future__ import annotations

import collections
import json
import secrets
from typing import Any

import models.realtime as wire

# Fields dropped from server events when null: our extensions, and fields of other item
# types, so each event reads as the OpenAI server's own.
_OMIT_IF_NULL = frozenset(
    {
        "server_event_seq",
        "capabilities",
        "resume_token",
        "produced_at",
        "call_id",
        "name",
        "arguments",
        "output",
        "audio",
        "text",
    }
)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(10)


def encode(event: wire.ServerEvent) -> str:
    return json.dumps(_strip(event.model_dump(mode="json")), separators=(",", ":"))


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not (v is None and k in _OMIT_IF_NULL)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


class ServerEventQueue:
    """A session's server events on their way to the socket: each gets its ``event_id``
    and (duplex) its ``server_event_seq``, is encoded once, and waits in :meth:`take`;
    numbered frames also go to the replay log (:meth:`since`) and the journal that the
    Redis-held log is fed from (:meth:`take_journal`). Not the webhook outbox
    (:class:`storage.outbox.WebhookOutbox`)."""

    def __init__(self, *, duplex: bool, replay_events: int) -> None:
        self.duplex = duplex
        self.seq = 0  # the last server_event_seq given out
        self._frames: list[str] = []
        self._replay: collections.deque[tuple[int, str]] = collections.deque(maxlen=replay_events)
        # Duplex: numbered frames not yet handed to the Redis-held log (take_journal).
        self._journal: list[tuple[int, str]] = []

    def put(self, event: wire.ServerEvent) -> None:
        event.event_id = new_id("event_")
        if self.duplex:
            self.seq += 1
            event.server_event_seq = self.seq
        text = encode(event)
        if self.duplex:
            self._replay.append((self.seq, text))
            self._journal.append((self.seq, text))
        self._frames.append(text)

    def take(self) -> list[str]:
        frames, self._frames = self._frames, []
        return frames

    def take_journal(self) -> list[tuple[int, str]]:
        """The numbered frames logged since the last call, to be stored before they are
        sent (so whatever a client saw, another replica can replay)."""
        journal, self._journal = self._journal, []
        return journal

    def continue_from(self, seq: int, logged: list[tuple[int, str]]) -> None:
        """Go on after ``seq`` (the numbering of a session taken over from another
        replica), with ``logged`` as the replay log; nothing is queued to send."""
        self.seq = seq
        self._replay.clear()
        self._replay.extend(logged)
        self._frames, self._journal = [], []

    def since(self, last_seq: int) -> list[str] | None:
        """The logged frames after ``last_seq``, in order; None when some are gone (or
        ``last_seq`` was never given out)."""
        oldest = self._replay[0][0] if self._replay else self.seq + 1
        if last_seq > self.seq or last_seq + 1 < oldest:
            return None
        return [text for seq, text in self._replay if seq > last_seq]

    def restart(self, frames: list[str]) -> None:
        """A resumed socket starts from ``frames``: what was queued for the lost one is
        in the replay log."""
        self._frames = list(frames)
