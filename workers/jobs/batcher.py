"""Continuous batching of denoise steps: the jobs a worker runs at once share one model
call per step, each with its own loop.

A job worker with ``OMNIQ_WORKER__BATCH_SIZE`` k above 1 runs up to k jobs at once, one
Celery thread each (``workers/runtime/celery_app.py``). For a model whose adapter is
:class:`~workers.pipelines.base.SupportsStepBatch` (LongCat), the executor gives the
model a :class:`StepBatcher`, and every job of it runs its own loop on its own thread
(``workers/jobs/output.py``): its stop gates, deadline, progress and PCM events, its
decode, encode and upload, exactly as alone. Only its calls into the model go through
the batcher's **device thread**, the one thread that touches the model:

* ``prepare`` and ``end`` (:meth:`StepBatcher.call`, in the caller's context, so the
  job's ``checkpoint()`` gates hold inside them), between two batched steps;
* every denoise step (:meth:`Member.step`): the job submits its state and waits. The
  device thread takes the steps submitted, waits up to ``OMNIQ_WORKER__BATCH_WAIT_MS``
  from when it is free for the other members' (a job joins at its first step and
  leaves after its last, or when it stops, whichever way), and runs them as one
  ``step_batch``: jobs at different steps share the pass (the adapter gives each row its
  own timestep), and a job that arrives while a batch runs joins the next one.

A stop (cancel, take-over, deadline, the worker's shutdown) of one member never cuts the
others' step: inside a batched step the block gates stop the pass only once every member
asks to stop (each is then raised its own reason); otherwise the member's step completes
with the others' and its loop stops at its own next gate, before its next step, which
is at most one step later than alone. An error of the batched call (out of memory) is
every member's of that step. The decode runs on the job's own thread, beside the
batches (it uses the VAE only, whose calls keep no state).

:class:`DeviceShare` is who may run on the device meanwhile: up to k jobs of batched
models together, or one job of any other model alone.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from workers.pipelines.base import Pipeline, StepState, StopReason, SupportsStepBatch, step_stops

log = logging.getLogger(__name__)

T = TypeVar("T")


class _AllStopped(Exception):
    """Every member of a batched step asked to stop before one of its blocks."""


@dataclass(eq=False)
class _Submitted:
    """One member's step, waiting for its batch."""

    state: StepState
    stop: StopReason
    done: Future[int] = field(default_factory=Future)  # the batch's size
    answer: BaseException | None = None  # the member's own stop, once it asked


class StepBatcher:
    """The device thread of one batchable model (module docstring): ``size`` members at
    most in one batch, the others' steps awaited ``wait_s`` at most."""

    def __init__(self, pipe: Pipeline, *, size: int, wait_s: float, name: str) -> None:
        if not isinstance(pipe, SupportsStepBatch):
            raise TypeError(f"{type(pipe).__name__} cannot batch its steps")
        self.pipe = pipe
        self._batched: SupportsStepBatch = pipe
        self.size = size
        self.wait_s = wait_s
        self.name = name
        self.largest = 0  # the most jobs one batched step has had (logs, tests)
        self._cond = threading.Condition()
        self._members = 0
        self._steps: list[_Submitted] = []
        self._first_step_at: float | None = None  # when the oldest waiting step came
        self._calls: deque[Callable[[], None]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    # ---- what the job threads call ----------------------------------------------

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the device thread, between two batched steps, in the caller's
        context (its checkpoint gates); its result, or its exception raised here."""
        context = contextvars.copy_context()
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(context.run(fn))
            except BaseException as exc:
                done.set_exception(exc)

        with self._cond:
            if self._closed:
                raise RuntimeError(f"the step batcher of {self.name} is closed")
            self._calls.append(run)
            self._cond.notify_all()
        return done.result()

    @contextmanager
    def member(self) -> Iterator[Member]:
        """A job's membership for its denoise loop: it joins the batches, and leaves them
        when the block ends (its last step, or a stop or failure)."""
        with self._cond:
            self._members += 1
        member = Member(self)
        try:
            yield member
        finally:
            with self._cond:
                self._members -= 1
                self._cond.notify_all()  # a gather waiting for this member's step

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _submit(self, item: _Submitted) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the step batcher of {self.name} is closed")
            if self._first_step_at is None:
                self._first_step_at = time.monotonic()
            self._steps.append(item)
            self._cond.notify_all()

    # ---- the device thread --------------------------------------------------------

    def _loop(self) -> None:
        while True:
            call, batch = self._next()
            if call is None and batch is None:
                return
            if call is not None:
                call()
            elif batch:
                self._run(batch)
            with self._cond:
                # The device is free from now: the steps that came while it was busy wait
                # for the others from now on, not from when they came. (Counted from then,
                # a step that came during a batch would run alone right after it, while
                # the batch's members resubmit, and the two groups would alternate.)
                if self._steps:
                    self._first_step_at = time.monotonic()

    def _next(self) -> tuple[Callable[[], None] | None, list[_Submitted] | None]:
        """The next thing to run: a call first, else a batch once every member has
        submitted its step, or ``wait_s`` after the oldest step came (or the device was
        last free, if later), or ``size`` steps
        wait; (None, None) once closed and idle."""
        with self._cond:
            while True:
                if self._calls:
                    return self._calls.popleft(), None
                if self._steps:
                    waited = time.monotonic() - (self._first_step_at or 0.0)
                    full = len(self._steps) >= min(self._members, self.size)
                    if full or waited >= self.wait_s:
                        batch, self._steps = self._steps[: self.size], self._steps[self.size :]
                        self._first_step_at = time.monotonic() if self._steps else None
                        return None, batch
                    self._cond.wait(self.wait_s - waited)
                    continue
                if self._closed:
                    return None, None
                self._cond.wait()

    def _run(self, batch: list[_Submitted]) -> None:
        """One ``step_batch`` of ``batch``; each member's future gets its outcome."""
        self.largest = max(self.largest, len(batch))

        def reason(block: int) -> BaseException | None:
            for item in batch:
                if item.answer is None:
                    item.answer = item.stop(block)
            if all(item.answer is not None for item in batch):
                return _AllStopped()
            return None

        try:
            with step_stops(reason):
                self._batched.step_batch([item.state for item in batch])
        except _AllStopped:
            for item in batch:
                assert item.answer is not None
                item.done.set_exception(item.answer)
        except BaseException as exc:
            for item in batch:
                item.done.set_exception(exc)
        else:
            for item in batch:
                item.done.set_result(len(batch))


class Stepper(Protocol):
    """How a job's loop runs its denoise steps (:func:`stepping`)."""

    largest: int  # the most jobs one of its steps ran with (1: alone)

    def step(self, state: StepState, stop: StopReason) -> None:
        """Run one denoise step of ``state``; ``stop`` is the job's stop question, asked
        before each block of it."""
        ...


@dataclass(eq=False)
class _Alone:
    """A job's steps run by its own thread, under its own stop gates."""

    pipe: Pipeline
    largest: int = 1

    def step(self, state: StepState, stop: StopReason) -> None:
        with step_stops(stop):
            self.pipe.step(state)


@dataclass(eq=False)
class Member:
    """One job's place in its model's batches (:meth:`StepBatcher.member`)."""

    batcher: StepBatcher
    largest: int = 0

    def step(self, state: StepState, stop: StopReason) -> None:
        """Run one denoise step of ``state`` in the next batch; ``stop`` is the job's stop
        question (asked before each block while the batch runs)."""
        item = _Submitted(state, stop)
        self.batcher._submit(item)
        self.largest = max(self.largest, item.done.result())


@contextmanager
def stepping(pipe: Pipeline, batcher: StepBatcher | None) -> Iterator[Stepper]:
    """How a job's loop runs its steps: alone, ``pipe.step`` under its own stop gates; or
    as a member of its model's batches."""
    if batcher is None:
        yield _Alone(pipe)
        return
    with batcher.member() as member:
        yield member


class DeviceShare:
    """Who runs on a worker's device: up to ``size`` jobs of batched models at once, or one
    job of any other model alone. A job that needs the device alone waits for the batched
    ones to end, and batched jobs that come after it wait for it (so it is not starved)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._shared = 0
        self._alone = False
        self._waiting_alone = 0

    @property
    def running(self) -> int:
        """The jobs holding the device now."""
        with self._cond:
            return self._shared + int(self._alone)

    @contextmanager
    def hold(self, *, batched: bool) -> Iterator[None]:
        """Hold the device for one job: shared for a job of a batched model, else alone."""
        with self._cond:
            if batched:
                while self._alone or self._waiting_alone or self._shared >= self.size:
                    self._cond.wait()
                self._shared += 1
            else:
                self._waiting_alone += 1
                while self._alone or self._shared:
                    self._cond.wait()
                self._waiting_alone -= 1
                self._alone = True
        try:
            yield
        finally:
            with self._cond:
                if batched:
                    self._shared -= 1
                else:
                    self._alone = False
                self._cond.notify_all()
