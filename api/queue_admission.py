"""Admission above saturation, per model queue (docs/limits.md, "Above saturation").

- **The queue bound.** A create for a model with ``max_depth`` jobs already queued is
  refused: 429 ``queue_full`` (``param`` ``model``), stored nothing, with ``Retry-After``
  the estimated time until enough of them have started (:meth:`QueueEstimates.retry_after_s`).
  The count is exact (one indexed COUNT, in the thread-pool call that stores the job,
  after the idempotency lookup), but not a lock: creates racing at the same instant may
  pass it together, one job over per concurrent create at most.
- **The default ttl.** A create that gives no ``ttl`` gets its model's
  (:class:`QueuePolicy`); the workers end a job still queued past it (``ttl_expired``:
  ``workers/jobs/claim.py``).
- **estimated_start_at.** A queued job at position ``p`` (``p`` jobs start before it)
  of a model with ``W`` live workers, ``S`` the mean run time (``completed_at -
  started_at``) of the model's recent completed jobs and ``r_1 ≤ … ≤ r_W`` the time each
  worker still needs for its current job (``S`` minus what it has run, at least 0; 0 for
  an idle worker), starts in ``r_{p mod W} + ⌊p / W⌋ · S``: each worker takes the next
  job as it frees, every ``S`` seconds. ``W`` is the larger of the workers' presence
  leases (``storage/worker_presence.py``) and the running jobs. Without a worker, or
  without a measured run time while every worker is busy, there is nothing to go on:
  None. Each API process reads a model's figures at most every
  ``OMNIQ_QUEUE__ETA_REFRESH_S``; a failed read gives None, never an error.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.refreshed import Refreshed
from models.db import Job, job_spec
from models.errors import QueueFull
from models.registry import ServedModel
from storage.jobs import JobStore
from storage.settings import QueueSettings
from storage.worker_presence import WorkerPresence

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """A model's queue bound (0: unbounded) and default ``ttl`` (seconds; 0: none)."""

    max_depth: int = 0
    ttl_s: int = 0


def queue_policies(
    served: dict[str, ServedModel], defaults: QueueSettings
) -> dict[str, QueuePolicy]:
    """Each served model's policy: its registry entry's ``max_queue_depth`` and ``ttl_s``,
    else the server's ``OMNIQ_QUEUE__MAX_DEPTH`` and ``OMNIQ_QUEUE__DEFAULT_TTL_S``."""
    return {
        name: QueuePolicy(
            max_depth=defaults.max_depth if m.max_queue_depth is None else m.max_queue_depth,
            ttl_s=defaults.default_ttl_s if m.ttl_s is None else m.ttl_s,
        )
        for name, m in served.items()
    }


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """What one model's waits are estimated from, as read at ``read_at``."""

    read_at: float
    workers: int  # live workers of the model (presence leases)
    running_starts: tuple[float, ...]  # started_at of its running jobs
    run_s: float | None  # mean run time of its recent completed jobs; None: none yet

    def wait_s(self, position: int, now: float) -> float | None:
        """Seconds until the queued job at ``position`` starts (module docstring)."""
        busy = len(self.running_starts)
        slots = max(self.workers, busy)
        if slots == 0:
            return None
        run_s = self.run_s
        if run_s is None:  # only an idle worker says anything
            return 0.0 if position < slots - busy else None
        left = [max(0.0, run_s - (now - started)) for started in self.running_starts]
        free = sorted(left + [0.0] * (slots - busy))
        return free[position % slots] + (position // slots) * run_s


class QueueEstimates:
    """Each model's :class:`QueueFigures`, cached per API process."""

    def __init__(
        self,
        jobs: JobStore,
        presence: WorkerPresence,
        settings: QueueSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._jobs = jobs
        self._presence = presence
        self._settings = settings
        self._clock = clock
        self._figures: dict[str, Refreshed[QueueFigures]] = {}
        self._lock = threading.Lock()  # every model's figures are read one at a time

    def figures(self, model: str) -> QueueFigures | None:
        """The model's figures, re-read when older than ``eta_refresh_s``. One thread
        reads; the others meanwhile take the previous figures (:class:`Refreshed`)."""
        refreshed = self._figures.get(model)
        if refreshed is None:
            refreshed = Refreshed(
                lambda now: self._read(model, now),
                self._settings.eta_refresh_s,
                self._clock,
                self._lock,
            )
            refreshed = self._figures.setdefault(model, refreshed)
        return refreshed.get()

    def _read(self, model: str, now: float) -> QueueFigures:
        """Fresh figures; after a failed read the previous ones (or none: no estimate),
        kept until the next refresh, so a database or Redis outage costs one failed read
        per interval, never one per answer."""
        try:
            _, starts, runs = self._jobs.queue_figures(model, self._settings.eta_sample)
            workers = self._presence.count(model)
        except Exception:  # an estimate is never worth failing a read over
            log.warning("could not read the queue figures of %s", model, exc_info=True)
            before = self._figures[model].last()
            figures = QueueFigures(now, 0, (), None) if before is None else before
            return dataclasses.replace(figures, read_at=now)
        run_s = sum(runs) / len(runs) if runs else None
        return QueueFigures(now, workers, tuple(starts), run_s)

    def estimated_start_at(self, model: str, position: int | None) -> int | None:
        """When the queued job at ``position`` should start (unix seconds)."""
        if position is None:
            return None
        figures = self.figures(model)
        now = self._clock()
        wait = None if figures is None else figures.wait_s(position, now)
        return None if wait is None else math.ceil(now + wait)

    def retry_after_s(self, model: str, queued: int, max_depth: int) -> int:
        """Seconds until ``queued - max_depth + 1`` of the model's queued jobs have
        started, so that one more fits; ``retry_after_s`` of the settings without an
        estimate."""
        figures = self.figures(model)
        wait = None if figures is None else figures.wait_s(queued - max_depth, self._clock())
        if wait is None:
            return self._settings.retry_after_s
        return max(1, math.ceil(wait))


@dataclass(eq=False)
class QueueAdmission:
    """The queue checks of a create, run where the job is stored
    (:meth:`api.jobs_service.JobService.insert`)."""

    jobs: JobStore
    policies: dict[str, QueuePolicy]
    estimates: QueueEstimates

    def admit(self, job: Job) -> None:
        """Give ``job`` its model's default ``ttl`` when its create gave none; refuse it
        (:class:`QueueFull`) when the model's queue is at its bound."""
        policy = self.policies.get(job.model, QueuePolicy())
        if job.ttl_s is None and policy.ttl_s:
            job.ttl_s = policy.ttl_s  # the column, and the spec the worker reads
            spec = job_spec(job).model_copy(update={"ttl_s": policy.ttl_s})
            job.spec = spec.model_dump(mode="json")
        if not policy.max_depth:
            return
        queued = self.jobs.count_queued(job.model)
        if queued >= policy.max_depth:
            retry = self.estimates.retry_after_s(job.model, queued, policy.max_depth)
            raise QueueFull(
                f"the queue of model {job.model!r} is full ({queued} jobs queued, at most "
                f"{policy.max_depth}); retry after {retry} s",
                param="model",
                headers={"Retry-After": str(retry)},
            )


def queue_admission(
    jobs: JobStore, redis: Any, served: dict[str, ServedModel], settings: QueueSettings
) -> QueueAdmission:
    """The admission of an API process: its models' policies and an estimate cache on
    ``redis`` (a blocking client, every command bounded)."""
    estimates = QueueEstimates(jobs, WorkerPresence(redis), settings)
    return QueueAdmission(jobs, queue_policies(served, settings), estimates)
