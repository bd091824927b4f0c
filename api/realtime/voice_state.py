"""One API replica's link between a duplex voice session and its Redis-held state
(:mod:`storage.session_state`), so that any replica can resume it.

The replica serving a session calls :meth:`VoiceStateSync.save` before it sends anything
to the client: the new numbered events, the conversation's audio changes, the protocol
snapshot (:mod:`realtime.session_snapshot`) and the worker's new commands go to Redis in
one fenced write. A replica that receives ``session.resume`` for a session it does not hold calls
:func:`take_over`: from then on the previous replica's writes are refused (it learns it
from ``save``/``touch`` answering False and lets the session go), and the restored
protocol replays the logged events after the client's last seq and goes on numbering.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from models.realtime_state import VoiceSessionSnapshot
from realtime.audio_protocol import VoiceSessionOptions, VoiceSessionProtocol
from realtime.input_audio import VadFactory
from realtime.session_snapshot import (
    AudioDiff,
    PartKey,
    RelayPosition,
    audio_parts,
    restore,
    snapshot,
)
from storage.session_state import SessionStateStore


class VoiceStateSync:
    def __init__(self, store: SessionStateStore, session_id: str, owner: str) -> None:
        self.store = store
        self.session_id = session_id
        self.owner = owner
        self.holder = secrets.token_hex(12)  # this replica's hold on the session
        self.diff = AudioDiff()
        self.created = False
        self._saved_at = 0.0

    async def save(
        self,
        protocol: VoiceSessionProtocol,
        relay: RelayPosition,
        *,
        commands: Sequence[tuple[BaseModel, bytes | None]],
        now: float,
        wall: float,
    ) -> bool:
        """Store what changed since the last save, and send the worker ``commands`` in
        the same write: always when events were emitted, the conversation's audio
        changed or there are commands. False when another replica holds the session now
        (nothing stored, no command sent)."""
        frames = protocol.journal()
        parts = audio_parts(protocol)
        writes = self.diff.writes(parts)
        if not (frames or writes or commands):
            return True
        if not self.created:
            await self.store.create(self.session_id, self.holder)
            self.created = True
        state = snapshot(protocol, self.owner, relay, now, wall).model_dump_json()
        ok = await self.store.save(
            self.session_id,
            self.holder,
            frames=frames,
            state=state,
            writes=[(w.op, w.part, w.data) for w in writes],
            parts=list(parts),
            commands=commands,
        )
        if ok:
            self.diff.written(writes, parts)
            self._saved_at = now
        return ok

    async def touch(self, protocol: VoiceSessionProtocol, now: float) -> bool:
        """Keep the stored state alive (every quarter of its TTL); False when it is not
        ours any more."""
        if not self.created or now - self._saved_at < self.store.ttl_s / 4:
            return True
        ok = await self.store.touch(self.session_id, self.holder, list(audio_parts(protocol)))
        self._saved_at = now
        return ok

    async def drop(self, protocol: VoiceSessionProtocol) -> None:
        """The session ended here: its stored state goes (unless another replica has it)."""
        if self.created:
            await self.store.drop(self.session_id, self.holder, list(audio_parts(protocol)))


@dataclass
class TakenOverSession:
    protocol: VoiceSessionProtocol
    relay: RelayPosition
    sync: VoiceStateSync
    model: str


async def take_over(
    store: SessionStateStore,
    session_id: str,
    token: str,
    owner: str,
    last_seq: int,
    options: VoiceSessionOptions,
    vad_factory: VadFactory,
    now: float,
    wall: float,
) -> TakenOverSession | None:
    """Take a stored session over for ``owner`` holding ``token``; None (nothing taken)
    when there is no such session, it ended, or the token or owner is wrong.
    ``options.model`` is replaced by the session's own."""
    raw = await store.load(session_id)
    if raw is None:
        return None
    try:
        snap = VoiceSessionSnapshot.model_validate_json(raw)
    except ValidationError:
        return None  # written by an incompatible version
    if (
        snap.owner != owner
        or snap.state == "closed"
        or not secrets.compare_digest(token.encode(), snap.resume_token.encode())
    ):
        return None
    sync = VoiceStateSync(store, session_id, owner)
    taken = await store.take_over(session_id, sync.holder, last_seq)
    if taken is None:
        return None
    snap = VoiceSessionSnapshot.model_validate_json(taken.state)  # as of the swap
    parts: list[PartKey] = [(s.item.id, i) for s in snap.items if s.item.id for i in s.audio]
    audio = await store.audio(session_id, parts)
    options.model = snap.model
    protocol = restore(snap, audio, taken.log, options, vad_factory, now, wall)
    sync.created = True
    sync.diff = AudioDiff({p: len(a) for p, a in audio.items()})
    relay = RelayPosition(snap.placed, snap.worker_admitted, snap.out_cursor)
    return TakenOverSession(protocol, relay, sync, snap.model)
