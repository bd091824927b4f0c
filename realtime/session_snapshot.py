"""Sans-I/O snapshot and restore of a duplex ``VoiceSessionProtocol``, so that another API
replica can take the session over (``models/realtime_state.py`` says what is kept).

:func:`snapshot` reads the machine; :func:`restore` builds an equal one on another
process, continuing the ``server_event_seq`` numbering, with the stored log as its replay
log. :class:`AudioDiff` turns the conversation's audio into the few writes that bring the
stored copy up to date (appends while a response streams, rewrites after a truncation).

What is not carried over: the uncommitted input audio buffer and the voice-activity
detector's state (a turn the client was speaking when its replica died starts again
from the next audio it sends), and commands not yet handed to the worker.

This module is the protocol's friend: it reads and sets the machine's clocks and
counters, which are private to everyone else.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from models.realtime_state import ItemState, ResponseState, VoiceSessionSnapshot
from realtime.audio_protocol import State, VoiceSessionOptions, VoiceSessionProtocol
from realtime.conversation import Entry
from realtime.input_audio import VadFactory
from realtime.responses import ResponseRun

# (item id, content index) of one audio part
PartKey = tuple[str, int]


@dataclass(frozen=True)
class RelayPosition:
    """Where the API's relay of the worker's outputs stood."""

    placed: bool = False
    worker_admitted: bool = False
    out_cursor: str = "0-0"


def _to_wall(t: float | None, now: float, wall: float) -> float | None:
    return None if t is None else wall + (t - now)


def _to_mono(t: float | None, now: float, wall: float) -> float | None:
    return None if t is None else now + (t - wall)


def _fields(run: ResponseRun) -> dict[str, Any]:
    """A response run's fields by name: ``ResponseState`` has the same ones (its clocks
    on the wall clock instead of the monotonic one)."""
    return {f.name: getattr(run, f.name) for f in fields(run)}


def snapshot(
    p: VoiceSessionProtocol, owner: str, relay: RelayPosition, now: float, wall: float
) -> VoiceSessionSnapshot:
    """The state of ``p`` (duplex) at monotonic ``now`` = epoch ``wall``."""
    assert p.options.duplex and p.resume_token is not None
    items = []
    for item_id in p.conversation.ids():
        entry = p.conversation.get(item_id)
        assert entry is not None
        audio = {i: len(a) for i, a in entry.audio.items()}
        items.append(ItemState(item=entry.item, audio=audio))
    active = None
    if p.active is not None:
        run = p.active
        clocks = {
            "cancel_deadline": _to_wall(run.cancel_deadline, now, wall),
            "started_at": wall + (run.started_at - now),
        }
        active = ResponseState(**_fields(run) | clocks)
    return VoiceSessionSnapshot(
        session_id=p.id,
        owner=owner,
        model=p.options.model,
        state=p.state.value,
        resume_token=p.resume_token,
        session=p.session,
        last_seq=p.last_seq,
        responses=p._responses,
        expires_at=_to_wall(p._expires_at, now, wall),
        idle_deadline=_to_wall(p._idle_deadline, now, wall),
        input_position=p.input.position,
        items=items,
        active=active,
        placed=relay.placed,
        worker_admitted=relay.worker_admitted,
        out_cursor=relay.out_cursor,
    )


def audio_parts(p: VoiceSessionProtocol) -> dict[PartKey, bytearray]:
    """Every audio part of the conversation, by reference."""
    parts: dict[PartKey, bytearray] = {}
    for item_id in p.conversation.ids():
        entry = p.conversation.get(item_id)
        assert entry is not None
        for index, audio in entry.audio.items():
            parts[(item_id, index)] = audio
    return parts


def restore(
    snap: VoiceSessionSnapshot,
    audio: dict[PartKey, bytes],
    logged: list[tuple[int, str]],
    options: VoiceSessionOptions,
    vad_factory: VadFactory,
    now: float,
    wall: float,
) -> VoiceSessionProtocol:
    """A machine equal to the snapshotted one: the next event is numbered
    ``snap.last_seq + 1``, ``logged`` (frames after the client's last seq) is its replay
    log, and nothing is queued to send. Audio missing from ``audio`` (expired) is empty."""
    p = VoiceSessionProtocol(snap.session_id, options, vad_factory, now)
    p.data_to_send()  # the fresh session.created: the session exists already
    p._outbox.continue_from(snap.last_seq, logged)
    p.state = State(snap.state)
    p.resume_token = snap.resume_token
    p.session = snap.session.model_copy(deep=True)
    p._responses = snap.responses
    p._expires_at = _to_mono(snap.expires_at, now, wall)
    p._idle_deadline = _to_mono(snap.idle_deadline, now, wall)
    p.input.position = p.input.start = snap.input_position
    p.input.vad = None  # a new detector, starting at the restored position
    p._sync_vad()
    previous: str | None = None
    for state in snap.items:
        item = state.item.model_copy(deep=True)
        assert item.id is not None
        kept = {i: bytearray(audio.get((item.id, i), b"")[:n]) for i, n in state.audio.items()}
        p.conversation.add(Entry(item, kept), previous)
        previous = item.id
    if snap.active is not None:
        a = snap.active
        clocks = {
            "cancel_deadline": _to_mono(a.cancel_deadline, now, wall),
            "started_at": now + (a.started_at - wall),
        }
        p.active = ResponseRun(**a.model_dump() | clocks)
    return p


@dataclass(frozen=True)
class AudioWrite:
    """``append`` ``data`` to a stored part, ``set`` it to ``data``, or ``delete`` it."""

    op: str
    part: PartKey
    data: bytes = b""


class AudioDiff:
    """What the store holds of each audio part (its length), and the writes that bring
    it up to the conversation's audio. A part only grows while its response streams; any
    other change (truncation, trimming) makes it shorter and is rewritten whole."""

    def __init__(self, stored: dict[PartKey, int] | None = None) -> None:
        self.stored: dict[PartKey, int] = dict(stored or {})

    def writes(self, parts: dict[PartKey, bytearray]) -> list[AudioWrite]:
        out = []
        for key, audio in parts.items():
            have = self.stored.get(key)
            if have is None or len(audio) < have:
                out.append(AudioWrite("set", key, bytes(audio)))
            elif len(audio) > have:
                out.append(AudioWrite("append", key, bytes(audio[have:])))
        out += [AudioWrite("delete", key) for key in self.stored if key not in parts]
        return out

    def written(self, writes: list[AudioWrite], parts: dict[PartKey, bytearray]) -> None:
        """The writes were stored."""
        for w in writes:
            if w.op == "delete":
                self.stored.pop(w.part, None)
            else:
                self.stored[w.part] = len(parts[w.part])
