"""Resume of ``/v1/realtime/video`` sessions on any API replica
(``docs/protocols/realtime-video.md``, "Resume after a dropped socket").

The chunks of a session are already in Redis (its ``out`` stream, written by the
worker); what a replica needs besides is small and set once ``video.start`` is due: the
session's owner, resume token, resolved config and interaction ids
(``models/realtime_state.py``). :class:`WorldResumeRecord` stores it, fenced by the same
holder key as voice sessions (:mod:`storage.session_state`), before ``video.start``
reaches the client, so any token a client holds can be resumed. :func:`take_over` makes a
new socket's replica the holder and rebuilds the protocol; the replica that held it
learns from :meth:`WorldResumeRecord.holds` that it lost it (its socket, if any, gets
``session_taken_over``), and stops sending keep-alives for it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from pydantic import ValidationError

from models.realtime_state import WorldSessionSnapshot
from models.realtime_video import SessionResume
from realtime.video_protocol import WorldSessionOptions, WorldSessionProtocol
from storage.session_state import SessionStateStore


def _wall(t: float | None, now: float, wall: float) -> float | None:
    return None if t is None else wall + (t - now)


class WorldResumeRecord:
    def __init__(self, store: SessionStateStore, session_id: str, owner: str) -> None:
        self.store = store
        self.session_id = session_id
        self.owner = owner
        self.holder = secrets.token_hex(12)
        self.created = False

    async def save(
        self, protocol: WorldSessionProtocol, model: str, now: float, wall: float
    ) -> bool:
        """Store what a resume needs (call before ``video.start`` or an interaction's
        reply is sent); False when another replica holds the session now."""
        assert protocol.config is not None
        if not self.created:
            await self.store.create(self.session_id, self.holder)
            self.created = True
        snap = WorldSessionSnapshot(
            session_id=self.session_id,
            owner=self.owner,
            model=model,
            resume_token=protocol.resume_token,
            config=protocol.config,
            default_transition=protocol.default_transition,
            event_ids=protocol.event_ids,
            expires_at=_wall(protocol.expires_at, now, wall),
        )
        return await self.store.save(self.session_id, self.holder, state=snap.model_dump_json())

    async def holds(self) -> bool:
        """Whether this replica still serves the session (refreshing its TTL)."""
        return not self.created or await self.store.touch(self.session_id, self.holder)

    async def still_held(self) -> bool:
        """:meth:`holds` without the refresh (one GET): checked before chunks go out, so a
        socket the session was resumed away from gets no chunk the worker made after."""
        return not self.created or await self.store.holds(self.session_id, self.holder)

    async def drop(self) -> None:
        if self.created:
            await self.store.drop(self.session_id, self.holder)


@dataclass
class TakenOverWorldSession:
    protocol: WorldSessionProtocol
    record: WorldResumeRecord
    model: str


async def take_over(
    store: SessionStateStore,
    resume: SessionResume,
    owner: str,
    options: WorldSessionOptions,
    now: float,
    wall: float,
) -> TakenOverWorldSession | None:
    """Hold the session named by ``resume`` from now on and rebuild its protocol, with
    ``session.resumed`` queued; None (nothing taken) when there is no such session, it
    is not ``owner``'s, or the token is wrong."""
    raw = await store.load(resume.session_id)
    if raw is None:
        return None
    try:
        snap = WorldSessionSnapshot.model_validate_json(raw)
    except ValidationError:
        return None
    token_ok = secrets.compare_digest(resume.resume_token.encode(), snap.resume_token.encode())
    if snap.owner != owner or not token_ok:
        return None
    record = WorldResumeRecord(store, resume.session_id, owner)
    if await store.take_over(resume.session_id, record.holder, after_seq=0) is None:
        return None
    record.created = True
    expires = None if snap.expires_at is None else now + (snap.expires_at - wall)
    protocol = WorldSessionProtocol.restored(
        snap.session_id,
        now,
        options,
        config=snap.config,
        resume_token=snap.resume_token,
        event_ids=snap.event_ids,
        default_transition=snap.default_transition,
        expires_at=expires,
        model=snap.model,
    )
    protocol.resume(resume.last_generation_chunk_index)
    return TakenOverWorldSession(protocol, record, snap.model)
