"""The one "stop this job" signal of a job run: every source feeds it, every gate reads it.

A job must stop when it is no longer ours to run: cancelled or deleted by the API
(``CANCEL`` sets ``status = failed, cancel_requested``), taken over by another worker, or
failed by the reconciler. The path from any of those to a stopped job:

Sources (each sets the signal; the first one wins, the signal stays set):

====================  =========================================================  ==========
source                what it notices                                            latency
====================  =========================================================  ==========
the bus               the ``done`` entry a cancel/delete writes to the job's     ms
                      stream right after its UPDATE (``workers/stop_watch.py``,
                      a thread blocked on XREAD)
the writer thread     its progress/heartbeat UPDATE matched no row (the job is   one
                      no longer in progress and ours: ``_start_heartbeat`` in    heartbeat
                      ``workers/executor.py``)
a row read            :meth:`StopSignal.poll`: a gate that can afford a database a gate's
                      read asks ``JobStore.still_owned``; no longer ours sets     interval
                      the signal (this is what catches a take-over, and a
                      cancel whose bus entry was lost)
====================  =========================================================  ==========

Gates (each reads the signal; a set signal raises :class:`models.errors.JobLost`, which
the executor turns into the run's cleanup and no terminal write of its own):

* between two steps and at every stage change (``_report``, ``_check``): a row read;
* inside prepare and decode, through ``checkpoint()`` (``_stop_point``): a row read at
  most every ``STOP_POINT_INTERVAL_S`` (20 ms);
* inside a step, before each denoiser block (``_in_step_stop``, the block gates of
  ``workers/pipelines/blocks.py``): the signal alone, no database read;
* before each part of a multipart upload (``_next_part``) and after each file: a row
  read (a refused part aborts the upload, ``UploadAborted``);
* a failpoint ``pause`` (tests) waits while the signal is not set.

Whatever stops the job, the terminal state was written by whoever took it from us, so
the executor only cleans up. A late ``complete`` cannot undo a cancel either way: its
UPDATE matches only a row still in progress and ours (``storage/job_statements.py``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from models.errors import JobLost


class StopSignal:
    """Set once the job is no longer ours to run. ``owned`` reads the job row (None: no
    row reads, the signal is only ever set by :meth:`set`)."""

    def __init__(self, owned: Callable[[], bool] | None = None) -> None:
        self._flag = threading.Event()
        self._owned = owned
        self._polled = -math.inf  # monotonic time of the last row read

    def set(self) -> None:
        """A source found the job no longer ours."""
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
            raise JobLost
