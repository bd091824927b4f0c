"""The one "stop this job" signal of a job run: every source feeds it, every gate reads it.

A job must stop when it is no longer ours to run: cancelled or deleted by the API
(``CANCEL`` sets ``status = failed, cancel_requested``), taken over by another worker, or
failed by the reconciler. The path from any of those to a stopped job:

Sources (each sets the signal; the first one wins, the signal stays set):

====================  =========================================================  ==========
source                what it notices                                            latency
====================  =========================================================  ==========
the bus               the ``done`` entry a cancel/delete writes to the job's     ms
                      stream right after its UPDATE (:meth:`StopSignal.watch`,
                      a thread blocked on XREAD)
the writer thread     its progress/heartbeat UPDATE matched no row (the job is   one
                      no longer in progress and ours: the heartbeat of           heartbeat
                      :class:`workers.jobs.run.JobRun`)
a row read            :meth:`StopSignal.poll`: a gate that can afford a database a gate's
                      read asks ``JobStore.still_owned``; no longer ours sets     interval
                      the signal (this is what catches a take-over, and a
                      cancel whose bus entry was lost)
====================  =========================================================  ==========

Gates (each reads the signal; a set signal raises :class:`models.errors.JobLost`, which
the executor turns into the run's cleanup and no terminal write of its own). They are
methods of :class:`workers.jobs.run.JobRun` (``report``, ``stop_point`` and
``in_step_stop`` check the deadline too, and raise ``JobTimedOut`` past it):

* between two steps and at every stage change (``report``, ``check``): a row read;
* inside prepare and decode, through ``checkpoint()`` (``stop_point``, set with
  ``checkpoints`` of ``workers/pipelines/base.py``): a row read at most every
  ``STOP_POINT_INTERVAL_S`` (20 ms);
* inside a step, before each denoiser block (``in_step_stop``, set with ``step_stops``
  and asked by the block gates of ``workers/pipelines/blocks.py``): the signal alone,
  no database read;
* before each part of a multipart upload (``next_part``) and after each file: a row
  read (a refused part aborts the upload, ``UploadAborted``);
* a failpoint ``pause`` (tests) waits while the signal is not set.

Whatever stops the job, the terminal state was written by whoever took it from us, so
the executor only cleans up. A late ``complete`` cannot undo a cancel either way: its
UPDATE matches only a row still in progress and ours (``storage/job_statements.py``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from models.errors import JobLost
from storage.bus import EventBus
from storage.constants import job_events_key

log = logging.getLogger(__name__)

BLOCK_MS = 1000  # one XREAD's wait of the bus watch; how long it outlives its run at most


class StopSignal:
    """Set once the job is no longer ours to run. ``owned`` reads the job row (None: no
    row reads, the signal is only ever set by :meth:`set`)."""

    def __init__(self, owned: Callable[[], bool] | None = None) -> None:
        self._flag = threading.Event()
        # What a gate raises once set: JobLost, or WorkerStopping when the worker's own
        # shutdown set it first (the job then goes back to the queue).
        self.cause: type[JobLost] = JobLost
        self._owned = owned
        self._polled = -math.inf  # monotonic time of the last row read
        self._closed = threading.Event()  # set: the run ended, the bus watch stops
        self._thread: threading.Thread | None = None  # the bus watch, once started

    def set(self, cause: type[JobLost] = JobLost) -> None:
        """A source found the job no longer ours (``cause``: what the gates raise; the
        first source's stays)."""
        if not self._flag.is_set():
            self.cause = cause
        self._flag.set()

    def is_set(self) -> bool:
        """What a gate that reads no row asks (the block gates)."""
        return self._flag.is_set()

    def poll(self, min_interval_s: float = 0.0) -> bool:
        """:meth:`is_set`, after reading the row unless the last read is more recent than
        ``min_interval_s``; a row that is no longer ours sets the signal."""
        if self._flag.is_set():
            return True
        now = time.monotonic()
        if self._owned is not None and now - self._polled >= min_interval_s:
            self._polled = now
            if not self._owned():
                self._flag.set()
        return self._flag.is_set()

    def check(self, min_interval_s: float = 0.0) -> None:
        """Raise :class:`JobLost` when the job is no longer ours (:meth:`poll`)."""
        if self.poll(min_interval_s):
            raise self.cause()

    def watch(self, bus: EventBus | None, job_id: str, after: str | None) -> StopSignal:
        """Start the bus source: a thread blocked on the job's event stream from entry
        ``after`` on, which sets the signal on a ``done`` entry other than a completion
        (a cancel or delete writes one right after its UPDATE). Without a bus, or without
        an entry to read after, the heartbeat and row reads are the only sources."""
        if bus is not None and after is not None:
            key = job_events_key(job_id)
            self.follow(
                key,
                after,
                lambda last: bus.read(key, last, block_ms=BLOCK_MS),
                lambda entry: entry.type == "done" and entry.event.get("status") != "completed",
            )
        return self

    def follow(
        self,
        key: str,
        after: str,
        read: Callable[[str], Sequence[Any]],
        stops: Callable[[Any], bool],
    ) -> None:
        """Start a thread that reads stream ``key`` after entry ``after`` (``read(last)``,
        blocking up to ``BLOCK_MS``) until the run ends, and sets the signal on the first
        entry that ``stops``."""
        thread = threading.Thread(
            target=self._follow,
            args=(key, after, read, stops),
            name=f"stopwatch-{key}",
            daemon=True,
        )
        thread.start()
        self._thread = thread

    def close(self) -> None:
        """The run ended: the bus watch stops (within ``BLOCK_MS``)."""
        self._closed.set()

    def _follow(
        self,
        key: str,
        after: str,
        read: Callable[[str], Sequence[Any]],
        stops: Callable[[Any], bool],
    ) -> None:
        while not self._closed.is_set():
            try:
                entries = read(after)
            except Exception:
                if self._closed.is_set():  # the run ended meanwhile (its worker may be
                    return  # shutting down its connections): nothing left to watch
                log.warning("stop watch of %s: bus read failed", key, exc_info=True)
                self._closed.wait(BLOCK_MS / 1000)
                continue
            for entry in entries:
                after = entry.id
                if stops(entry):
                    self.set()
                    return
