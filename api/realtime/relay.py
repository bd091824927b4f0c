"""The API's half of a realtime session's bus link, shared by voice
(``api/realtime/voice_session.py``) and world (``api/realtime/world_session.py``) sessions.

A :class:`Relay` places the session on a worker (the first keep-alive creates the ``in``
stream with its TTL, then a Celery task on the model's realtime queue carries the
session's config), sends the session's commands, keeps the worker informed that the API
is alive, and relays the worker's outputs to the session under two clocks
(``realtime/worker_watch.py``): no ``accepted`` within the admission timeout →
``resource_exhausted`` (the session is marked abandoned, so a late worker does not start
it); an admitted worker that is dead (its lease ran out or the connection it names
closed, ``storage/session_lease.py``; or silent for ``lost_after_s``) → ``worker_lost``,
unless the session has a checkpoint to go on from (a world session of a model that takes
snapshots, with a chunk sent): then it is placed again, on any worker of its model, which
takes it over from the last chunk sent (``storage/session_checkpoint.py``,
``workers/sessions/world_checkpoint.py``), once per chunk. The client sees nothing of it
but the wait; a takeover no worker admits in time ends the session with ``worker_lost``.

Where the relay stands (placed, worker admitted, the last output read) is
:class:`~realtime.session_snapshot.RelayPosition`: a duplex voice session stores it in
Redis, and the replica that takes the session over starts its relay from there.

The session says what to do with all that through :class:`RelayTarget`. Every broker call
is bounded (``api/realtime/broker.py``); a broker that fails or stalls ends the session with
``broker_error`` (the target's ``broker_lost``), never a hung socket.

Commands and outputs are the typed models of ``models/session_bus.py``; the worker's half
is ``workers/sessions/slot.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any, Protocol

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.model_availability import ModelAvailability
from api.realtime.broker import BROKER_ERRORS, bounded
from models.errors import model_unavailable_message
from models.session_bus import OUTPUTS, KeepaliveCommand, SessionConfig, SessionOutput
from realtime.session_snapshot import RelayPosition
from realtime.worker_watch import WORKER_LOST, WorkerWatch
from storage.bus import AsyncEventBus, BusMessage
from storage.constants import (
    session_abandoned_key,
    session_in_key,
    session_lease_key,
    session_out_key,
)
from storage.queue import JobQueue
from storage.session_checkpoint import claim_takeover
from storage.session_lease import LeaseLook
from storage.session_state import SessionStateStore
from storage.settings import RealtimeSettings, Settings

log = logging.getLogger(__name__)

# How long one read of the worker's outputs blocks when nothing comes.
READ_BLOCK_MS = 250
ABANDONED_TTL_S = 3600


class SessionHost(Protocol):
    """What a session needs of the API process (``api.state.AppState`` is one)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def abus(self) -> AsyncEventBus: ...

    @property
    def queue(self) -> JobQueue: ...

    @property
    def session_states(self) -> SessionStateStore: ...

    @property
    def voice_sessions(self) -> dict[str, Any]: ...

    @property
    def detached_world_sessions(self) -> dict[str, Any]: ...

    @property
    def availability(self) -> ModelAvailability: ...


class RelayTarget(Protocol):
    """The session as the relay drives it."""

    def ended(self) -> bool:
        """The session is over: the relay and the keep-alive stop."""

    async def outputs(self, entries: list[BusMessage[SessionOutput]], now: float) -> None:
        """Apply the worker's outputs (none: nothing came within a read) and send."""

    async def worker_gone(self, code: str, message: str) -> None:
        """No worker took the session, or its worker fell silent: end it."""

    async def broker_lost(self) -> None:
        """Redis is gone: end the session with ``broker_error``."""

    async def keepalive_due(self) -> bool:
        """Before each keep-alive: False when the session is no longer this replica's
        (resumed on another one, which keeps the worker alive now): the keep-alives stop."""

    async def relay_ended(self) -> None:
        """The relay stopped (the session ended or the broker was lost)."""


class Relay:
    def __init__(
        self,
        session_id: str,
        host: SessionHost,
        target: RelayTarget,
        position: RelayPosition | None = None,
    ) -> None:
        """``position``: where the relay of a session taken over from another replica
        stood (it goes on after the last output that replica applied)."""
        self.id = session_id
        self.bus, self.queue = host.abus, host.queue
        self.availability = host.availability
        self.settings: RealtimeSettings = host.settings.realtime
        self.target = target
        self.inbox, self.outbox = session_in_key(session_id), session_out_key(session_id)
        position = position or RelayPosition()
        self.placed = position.placed
        self.admitted = position.worker_admitted  # the worker said ``accepted``
        self.cursor = position.out_cursor  # the last output read (and handed to the target)
        self.tasks: list[asyncio.Task[None]] = []
        self._reader: asyncio.Task[None] | None = None

    @functools.cached_property
    def leases(self) -> LeaseLook:
        """The look at a worker's lease, made on the first (a relay whose worker is
        never silent, or one without a bus in a unit test, makes none)."""
        return LeaseLook(self.bus.redis)

    @property
    def position(self) -> RelayPosition:
        return RelayPosition(self.placed, self.admitted, self.cursor)

    async def command(self, command: BaseModel, data: bytes | None = None) -> None:
        """Send one ``SessionCommand`` to the worker (``data``: its raw bytes)."""
        await bounded(self.bus.publish(self.inbox, command, data))

    async def place(self, config: SessionConfig) -> None:
        """Put the session on a worker of its model's realtime queue, then relay. Raises
        one of ``BROKER_ERRORS`` when the broker is gone (the caller ends the session).
        A model no live worker can load ends it at once with ``model_unavailable`` and the
        workers' reasons (``api/model_availability.py``), not after the admission timeout."""
        reasons = await run_in_threadpool(self.availability.unavailable)
        if config.model in reasons:
            message = model_unavailable_message(config.model, reasons[config.model])
            await self.target.worker_gone("model_unavailable", message)
            return
        self.placed = True
        await self.command(KeepaliveCommand())  # creates the in stream with its TTL
        placed = run_in_threadpool(
            self.queue.start_session, self.id, config, expires_s=self.settings.admission_timeout_s
        )
        await bounded(placed)
        self.start()

    def start(self) -> None:
        """Relay the worker's outputs and send keep-alives, until the session ends."""
        self._reader = asyncio.create_task(self._relay())
        self.tasks.append(self._reader)
        self.tasks.append(asyncio.create_task(self._keepalive()))

    def stop_reading(self) -> None:
        """Stop relaying outputs, keep the keep-alives (a world session whose socket
        dropped: the worker goes on, its chunks wait in the ``out`` stream)."""
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()

    async def _relay(self) -> None:
        try:
            await self._relay_outputs()
        except BROKER_ERRORS:
            await self.target.broker_lost()
        await self.target.relay_ended()

    async def _relay_outputs(self) -> None:
        """Worker outputs → the session, with the admission and liveness clocks."""
        rt = self.settings
        watch = WorkerWatch(rt.admission_timeout_s, rt.lost_after_s, time.monotonic())
        watch.admitted = self.admitted
        while not self.target.ended():
            read = self.bus.read_as(OUTPUTS, self.outbox, self.cursor, block_ms=READ_BLOCK_MS)
            entries = await bounded(read)
            now = time.monotonic()
            if entries:
                self.cursor = entries[-1].id
                watch.heard([e.event for e in entries], now)
                self.admitted = watch.admitted
            elif (verdict := await self._verdict(watch, now)) is not None:
                if verdict[0] == WORKER_LOST and await self._take_over():
                    watch = WorkerWatch(
                        rt.admission_timeout_s, rt.lost_after_s, now, taking_over=True
                    )
                    self.admitted = False
                else:
                    await self._give_up(*verdict)
                continue
            await self.target.outputs(entries, now)

    async def _verdict(self, watch: WorkerWatch, now: float) -> tuple[str, str] | None:
        """The watch's verdict, the worker's lease looked at first when that is due."""
        attempt = watch.lease_check_due(now)
        if attempt is not None:
            held = await bounded(self.leases.held(session_lease_key(self.id, attempt)))
            if not held:
                watch.lease_gone()
        return watch.verdict(now)

    async def _take_over(self) -> bool:
        """Place the session again, to be taken over from its checkpoint; False when it
        has none to go on from (or was already taken over from it)."""
        ttl = self.settings.checkpoint_ttl_s
        claimed = await bounded(claim_takeover(self.bus.redis, self.id, ttl))
        if claimed is None:
            return False
        attempt, checkpoint = claimed
        placed = run_in_threadpool(
            self.queue.start_session,
            self.id,
            checkpoint.config,
            expires_s=self.settings.admission_timeout_s,
            attempt=attempt,
        )
        await bounded(placed)
        log.warning(
            "session %s: its worker is gone; placed again (attempt %d) from chunk %d",
            self.id,
            attempt,
            checkpoint.chunks,
        )
        return True

    async def _give_up(self, code: str, message: str) -> None:
        if not self.admitted:  # a worker that takes it late must not start it
            with contextlib.suppress(*BROKER_ERRORS):
                key = session_abandoned_key(self.id)
                await bounded(self.bus.redis.set(key, 1, ex=ABANDONED_TTL_S))
        await self.target.worker_gone(code, message)

    async def _keepalive(self) -> None:
        try:
            while not self.target.ended():
                await asyncio.sleep(self.settings.keepalive_s)
                if not await self.target.keepalive_due():
                    return
                await self.command(KeepaliveCommand())
        except BROKER_ERRORS:
            await self.target.broker_lost()

    def stop(self) -> None:
        """Cancel the relay and the keep-alive (the calling task itself excepted)."""
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        """:meth:`stop`, and wait for both tasks to end."""
        self.stop()
        for task in self.tasks:
            if task is not asyncio.current_task():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
