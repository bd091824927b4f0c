"""A job worker asked to stop keeps the work: the job it runs goes back to the queue.

On SIGTERM or SIGINT (``omniqueue up`` passes Ctrl-C on as SIGTERM) Celery stops taking
messages and lets the running task end. Its job would otherwise run to the end, or be
killed after ``up``'s grace and wait out its heartbeat as a stale ``in_progress`` before
another worker took it over. Instead :class:`Shutdown` sets the run's stop signal with
the cause :class:`~models.errors.WorkerStopping`, so the job stops at its next stop point
(before the next transformer block, inside a step), and the executor puts it back:
``in_progress → queued`` under its lease, a ``status: queued`` event, a new broker
message (``StepExecutor._release``). The next worker to start runs it at once.

``OMNIQ_WORKER__DRAIN_TIMEOUT_S`` (``up --drain-timeout``) lets the job finish first if it
ends within that many seconds; past them it is put back all the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from models.errors import WorkerStopping

if TYPE_CHECKING:
    from workers.jobs.run import JobRun

log = logging.getLogger(__name__)


class Shutdown:
    """The worker process's shutdown, as its job runs see it."""

    def __init__(self) -> None:
        # Re-entrant: request() runs in a signal handler, on the main thread, which may be
        # inside running() holding it at that moment.
        self._lock = threading.RLock()
        # The runs a shutdown stops: one, or several on a worker that batches jobs.
        self._runs: list[JobRun] = []
        self._requested = False
        self._stopping = False  # the drain is over: a running job stops

    def request(self, drain_s: float) -> None:
        """The worker was told to stop: the running jobs stop now, or after ``drain_s``
        seconds if it is still running then. Called from a signal handler: it only
        flags and starts a timer."""
        with self._lock:
            if self._requested:
                return
            self._requested = True
        if drain_s > 0:
            timer = threading.Timer(drain_s, self._stop)
            timer.daemon = True
            timer.start()
        else:
            self._stop()

    @contextmanager
    def running(self, run: JobRun) -> Iterator[None]:
        """Make ``run`` one that a shutdown stops, for the block."""
        with self._lock:
            self._runs.append(run)
            stopping = self._stopping
        if stopping:
            run.stop.set(WorkerStopping)
        try:
            yield
        finally:
            with self._lock:
                self._runs.remove(run)

    def _stop(self) -> None:
        with self._lock:
            self._stopping = True
            runs = list(self._runs)
        for run in runs:
            log.info("job %s: the worker is stopping; the job goes back to the queue", run.job.id)
            run.stop.set(WorkerStopping)
