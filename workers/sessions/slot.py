"""The worker's half of a realtime session's bus link, shared by both session runners
(``workers/sessions/world.py``: world, ``workers/sessions/voice.py``: voice).

:func:`run_in_slot` is the life of a session on a slot: a session the API already gave
up on (``abandoned``) is not started; otherwise ``accepted`` goes out (admission), the
runner serves it, and any exception becomes one ``failed`` output with a stable code and
a message safe to show (``workers.common.failures.classify``); but a world session taken over by
another worker meanwhile (``SessionTakenOver``) ends without a word. While it runs, the
worker holds the session's lease (``workers/sessions/lease.py``). :class:`SessionSlot` is
what the runner talks through: typed commands in (``models.session_bus.SessionCommand``),
typed outputs out, and the liveness clock both ways (a keep-alive every ``keepalive_s``;
no command nor keep-alive from the API for ``lost_after_s`` means it is gone).
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Sequence
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel

from models.errors import SessionTakenOver
from models.session_bus import (
    COMMANDS,
    AcceptedOutput,
    FailedOutput,
    KeepaliveOutput,
    SessionCommand,
)
from storage.bus import BusMessage, EventBus
from storage.constants import session_abandoned_key, session_in_key, session_out_key
from storage.settings import RealtimeSettings, Settings
from workers.common.failures import classify, log_level
from workers.common.memory import forget_frames, release_after_run
from workers.common.metrics import SLOTS
from workers.pipelines.registry import PipelineRegistry
from workers.sessions.lease import SessionLease

log = logging.getLogger(__name__)
ConfigT = TypeVar("ConfigT", bound=BaseModel)


class SessionSlot:
    """One session's two streams, seen from the worker: commands read in order (each
    one proof that the API is alive), outputs published."""

    def __init__(
        self, bus: EventBus, session_id: str, settings: RealtimeSettings, attempt: int = 1
    ) -> None:
        self.bus = bus
        self.id = session_id
        self.attempt = attempt  # the placement (> 1: taking over a world session)
        self.settings = settings
        self.inbox, self.out = session_in_key(session_id), session_out_key(session_id)
        self.after = "0-0"  # the last command read
        self.heard = time.monotonic()  # when the API was last heard from
        self.beat = 0.0  # when the last keep-alive went out

    def send(self, output: BaseModel, data: bytes | None = None) -> str:
        """Publish one ``SessionOutput`` (``data``: its raw bytes, if it has any)."""
        return self.bus.publish(self.out, output, data)

    def send_many(self, outputs: Sequence[tuple[BaseModel, bytes | None]]) -> None:
        """Publish several outputs in one round trip."""
        self.bus.publish_many(self.out, outputs)

    def commands(
        self, *, block_ms: int | None = None, count: int = 100
    ) -> list[BusMessage[SessionCommand]]:
        """The commands after the last one read (blocking up to ``block_ms`` for the
        first); reading any refreshes the API's liveness."""
        got = self.bus.read_as(COMMANDS, self.inbox, self.after, block_ms=block_ms, count=count)
        if got:
            self.after, self.heard = got[-1].id, time.monotonic()
        return got

    def first_commands(self, count: int = 10) -> list[BusMessage[SessionCommand]]:
        """The first commands of the stream, without consuming them (a world session's
        reference image, put there before it was placed)."""
        return self.bus.read_as(COMMANDS, self.inbox, "0-0", count=count)

    def api_lost(self, now: float) -> bool:
        """No command nor keep-alive from the API for ``lost_after_s``."""
        return now - self.heard > self.settings.lost_after_s

    def keepalive(self, now: float) -> None:
        """Tell the API the worker is alive, if ``keepalive_s`` passed since the last time."""
        if now - self.beat >= self.settings.keepalive_s:
            self.beat = now
            self.send(KeepaliveOutput())

    def next_beat_in(self, now: float) -> float:
        """Seconds until the next keep-alive is due."""
        return self.beat + self.settings.keepalive_s - now


class SlotRunner(abc.ABC, Generic[ConfigT]):
    """One kind of realtime session on a worker; a slot thread calls :meth:`run`."""

    label: ClassVar[str] = "session"

    def __init__(
        self, settings: Settings, pipelines: PipelineRegistry, bus: EventBus, worker_id: str
    ) -> None:
        self.settings = settings
        self.pipelines = pipelines
        self.bus = bus
        self.worker_id = worker_id

    def run(self, session_id: str, config: ConfigT, attempt: int = 1) -> str:
        """Run one session (placement ``attempt``); its outcome (``abandoned``, what
        :meth:`serve` returned, ``taken_over``, or the failure's code)."""
        rt = self.settings.realtime
        slot = SessionSlot(self.bus, session_id, rt, attempt)
        if self.bus.redis.exists(session_abandoned_key(session_id)):
            return "abandoned"  # the API gave up waiting for a slot
        lease = SessionLease(
            self.bus.redis,
            session_id,
            attempt,
            self.worker_id,
            lease_s=rt.worker_lease_s,
            every_s=rt.keepalive_s,
            bind=rt.worker_lease_connection,
        )
        with lease:  # before ``accepted``, which tells the API to look at it
            lease_s = rt.worker_lease_s or None
            slot.send(AcceptedOutput(worker_id=self.worker_id, attempt=attempt, lease_s=lease_s))
            try:
                with SLOTS.running(getattr(config, "model", "")):
                    outcome = self.serve(slot, config)
            except SessionTakenOver as exc:  # another worker has it: say nothing more
                log.warning("%s %s: %s", self.label, session_id, exc)
                forget_frames(exc)
                outcome = "taken_over"
            except Exception as exc:
                code, message = classify(exc)
                level = log_level(code)
                log.log(level, "%s %s failed: %s", self.label, session_id, code, exc_info=exc)
                forget_frames(exc)  # no tensor of the session stays referenced through exc
                slot.send(FailedOutput(code=code.value, message=message))
                outcome = code.value
        # the session's tensors die with its state; what a stop left queued on the device
        # has run when the outcome is logged (a benchmark reads that line as "idle")
        release_after_run(stopped=True)
        log.info("%s %s: %s", self.label, session_id, outcome)
        return outcome

    @abc.abstractmethod
    def serve(self, slot: SessionSlot, config: ConfigT) -> str:
        """Run the session until it ends; its outcome. An exception fails it (``failed``
        goes out once this returned)."""
