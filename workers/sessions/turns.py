"""Several world sessions on one loaded pipeline: fair turns at the device, a capacity
measured in real time, and a stop that lands inside a step.

A realtime worker runs each session on a thread of its own (``OMNIQ_REALTIME__SLOTS``),
and every session of a model shares the one loaded pipeline and its device:

* :class:`FairTurns` hands the device out one denoise step (or one chunk decode) at a
  time, first come first served. A session asking again after its step queues behind
  the ones already waiting, so with N sessions each waits at most N - 1 steps between
  two of its own, and no session falls more than one chunk step behind another. The
  turn also keeps a step's work from mixing with another's on the adapter's shared
  block gate.
* :class:`RealtimeCapacity` knows, per model, what a second of video costs the device:
  seconds per work unit (a pixel of a frame, times its chunk's steps), timed inside the
  turns (so waiting for another session is not counted), first by a probe chunk at
  start-up (:meth:`~workers.sessions.world.WorldSessionRunner.probe`), then by every
  chunk served (a moving average). A session is admitted while its load and the loads
  of the model's sessions already running fit in ``headroom`` seconds of device per
  second; the next is refused with ``resource_exhausted`` (after waiting briefly for a
  session that is ending) instead of being served a stream that falls behind. A
  registry entry's ``max_sessions`` fixes the number instead.
* :class:`SessionStop` watches a session's command stream on a thread of its own, so a
  ``stop`` sent while a step runs stops that step before its next transformer block
  (``step_stops``), and one sent during the chunk's decode stops it at the VAE's next
  cancel point (``checkpoints``): the device is free within one block, not one step.
  It also notes the newest ``interaction`` on the stream, so the gates of a chunk's last
  step, on a model that may run that step again (``SupportsStepRestart``), abort it with
  :class:`StepRestart` when one arrives that the session has not read yet: the runner
  reads it and runs the step again, and the interaction enters that chunk instead of the
  next one (:meth:`SessionStop.gate`). A stop keeps priority.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from models.session_bus import COMMANDS, InteractionCommand, StopCommand
from storage.bus import EventBus
from workers.common.stop_signal import BLOCK_MS, StopSignal
from workers.pipelines.base import StopReason

# Weight of the newest chunk in the moving average of a model's load.
LOAD_SMOOTHING = 0.3


class SessionStopped(Exception):
    """Raised inside a step by its block gate: the session was told to stop."""


class StepRestart(Exception):
    """Raised inside a chunk's last denoise step by its block gate: an interaction the
    session has not read yet arrived while it ran. The step left nothing behind
    (``SupportsStepRestart``): the runner reads the interaction and runs it again."""


class CapacityExceeded(Exception):
    """The model's sessions on this worker are as many as keep real time (the session
    gets ``resource_exhausted`` with this message)."""


class FairTurns:
    """A first-come, first-served turn (a ticket lock) at one device."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # the next ticket handed out
        self._serving = 0  # the ticket whose turn it is

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for this thread's turn, hold it for the block, pass it on."""
        with self._cond:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._serving += 1
                self._cond.notify_all()


@dataclass(frozen=True)
class Demand:
    """What one session asks of the device per second of its video: ``fps`` frames of
    ``width`` x ``height``, each chunk denoised in ``steps`` steps."""

    width: int
    height: int
    fps: float
    steps: int

    def work(self, frames: int) -> float:
        """Work units (pixels x steps) of ``frames`` frames."""
        return frames * self.width * self.height * self.steps

    def __str__(self) -> str:
        return f"{self.width}x{self.height} at {self.fps:g} fps, {self.steps} steps a chunk"


@dataclass
class _Model:
    limit: int | None  # the registry's max_sessions; None: from the measured cost
    cost: float | None = None  # device seconds per work unit
    live: dict[int, Demand] = field(default_factory=dict)


class RealtimeCapacity:
    """How many sessions of each world model this worker serves in real time.

    A model's *cost* is device seconds per work unit (a pixel of a frame, times the
    chunk's steps), a moving average over the chunks measured; a session's *load* is
    its cost per second of its video. A new session is admitted while the loads of the
    model's live sessions and its own stay within ``headroom`` (the first is always
    admitted: one session is served, however slow); waiting up to ``wait_s`` for a
    session that is ending to leave."""

    def __init__(self, headroom: float, limits: dict[str, int | None], wait_s: float = 2.0) -> None:
        self.headroom = headroom
        self.wait_s = wait_s
        self._models = {name: _Model(limit) for name, limit in limits.items()}
        self._cond = threading.Condition()
        self._tickets = 0

    def _model(self, name: str) -> _Model:
        return self._models.setdefault(name, _Model(None))

    def measured(self, name: str, device_s: float, work: float) -> None:
        """``work`` units (:meth:`Demand.work`) took ``device_s`` seconds of device turns."""
        if work <= 0:
            return
        cost = device_s / work
        with self._cond:
            m = self._model(name)
            m.cost = cost if m.cost is None else m.cost + LOAD_SMOOTHING * (cost - m.cost)

    def load(self, name: str, demand: Demand) -> float | None:
        """Device seconds a second of ``demand``'s video takes (None: not measured)."""
        with self._cond:
            cost = self._model(name).cost
        return None if cost is None else cost * demand.work(1) * demand.fps

    def limit(self, name: str, demand: Demand) -> int | None:
        """The most sessions of ``demand``'s shape at once (None: not measured)."""
        with self._cond:
            fixed = self._model(name).limit
        if fixed is not None:
            return fixed
        load = self.load(name, demand)
        if load is None:
            return None
        return max(1, math.floor(self.headroom / load)) if load > 0 else None

    def describe(self, name: str, demand: Demand) -> str:
        """What a second of ``demand``'s video costs this device and how many sessions of
        it keep real time, in words (the start-up probe's log line). Past one second of
        device per second of video none does, though one is still served."""
        load = self.load(name, demand)
        if load is None:
            return f"{name}: a second of video ({demand}) is not measured yet"
        cost = f"{name}: a second of video ({demand}) takes {load:.3f} s of this device"
        if load > 1:
            return (
                f"{cost}: no session of it keeps real time (one at a time is served, at "
                f"{1 / load:.2f}x real time)"
            )
        count = self.limit(name, demand)
        if count is None:  # no measurable load: only the slots bound it
            return f"{cost}: as many sessions of it as there are slots keep real time"
        keep = "session of it keeps" if count == 1 else "sessions of it keep"
        return f"{cost}: {count} {keep} real time"

    @contextlib.contextmanager
    def session(self, name: str, demand: Demand) -> Iterator[None]:
        """Hold a place for one session of ``demand`` for the block; raises
        :class:`CapacityExceeded` when none frees within ``wait_s``."""
        with self._cond:
            m = self._model(name)
            ticket = self._tickets = self._tickets + 1
            if not self._cond.wait_for(lambda: self._fits(m, demand), timeout=self.wait_s):
                raise CapacityExceeded(self._refusal(name, m, demand))
            m.live[ticket] = demand
        try:
            yield
        finally:
            with self._cond:
                del m.live[ticket]
                self._cond.notify_all()

    def _fits(self, m: _Model, demand: Demand) -> bool:
        if m.limit is not None:
            return len(m.live) < m.limit
        if not m.live or m.cost is None:
            return True
        loads = sum(m.cost * d.work(1) * d.fps for d in [*m.live.values(), demand])
        return loads <= self.headroom

    def _refusal(self, name: str, m: _Model, demand: Demand) -> str:
        running = len(m.live)
        sessions = "session" if running == 1 else "sessions"
        if m.limit is not None:
            return (
                f"{name} runs {running} {sessions} on this worker, its max_sessions; "
                "try again later"
            )
        assert m.cost is not None
        taken = sum(m.cost * d.work(1) * d.fps for d in m.live.values())
        mine = m.cost * demand.work(1) * demand.fps
        return (
            f"{name} cannot keep one more session in real time on this worker: its "
            f"{running} {sessions} take {taken:.2f} s of the device per second of video, "
            f"this one ({demand}) would take {mine:.2f} s more, past "
            f"OMNIQ_REALTIME__CAPACITY_HEADROOM ({self.headroom:g}); try again later"
        )


class SessionStop(StopSignal):
    """Set when a ``stop`` arrives on the session's command stream, read by the block
    gates of the step that runs meanwhile. The session's own reader consumes the same
    commands between steps; this one only looks, and notes the newest ``interaction``
    on the way (:meth:`gate`)."""

    def __init__(self, bus: EventBus, key: str) -> None:
        super().__init__()
        self._interaction = ((0, 0), "")  # the newest interaction seen: stream id, event id
        self.follow(
            key,
            "0-0",
            lambda last: bus.read_as(COMMANDS, key, last, block_ms=BLOCK_MS),
            self._sees,
        )

    def _sees(self, entry: Any) -> bool:
        """The follower's look at each entry: notes an interaction, stops on a stop."""
        if isinstance(entry.event, InteractionCommand):
            # one assignment, read whole by the gates: no lock needed
            self._interaction = (_stream_id(entry.id), entry.event.event_id)
        return isinstance(entry.event, StopCommand)

    def interaction_after(self, read: str) -> bool:
        """An interaction arrived after entry ``read`` (the last the session read)."""
        return self._interaction[0] > _stream_id(read)

    def reason(self, block: int) -> BaseException | None:
        """The block gates' question: stop before ``block``?"""
        return SessionStopped(f"stopped before block {block}") if self.is_set() else None

    def gate(self, read: str, restarts: Callable[[], bool]) -> StopReason:
        """The block gates' question in a step that may run again: :meth:`reason`, else
        :class:`StepRestart` once an interaction arrived after entry ``read`` (the last
        the session read before the step) and ``restarts()`` (the model may run this step
        again, and it is the chunk's last: ``SupportsStepRestart.restarts_step``)."""
        after = _stream_id(read)

        def ask(block: int) -> BaseException | None:
            if (stopped := self.reason(block)) is not None:
                return stopped
            seen, event_id = self._interaction
            if seen > after and restarts():
                return StepRestart(f"interaction {event_id} arrived before block {block}")
            return None

        return ask

    def check(self, min_interval_s: float = 0.0) -> None:
        """The question of the text encoder's and the VAE's cancel points (``checkpoint()``
        in a chunk's decode): raises :class:`SessionStopped` once a stop arrived."""
        if self.poll(min_interval_s):
            raise SessionStopped("stopped in the decode")


def _stream_id(entry_id: str) -> tuple[int, int]:
    """A Redis stream entry id (``ms-seq``) as a pair that orders as the stream does."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
