"""Tells a running job, within milliseconds, that it is to stop: the bus source of its
:class:`workers.stop_signal.StopSignal` (the other sources and every gate are listed
there).

Inside a step the denoiser's block gates (``workers/pipelines/blocks.py``) must not read
the database 30-60 times a step, so they read the signal. This thread sets it: it blocks
on the job's event stream, which every cancel and delete writes a ``done`` entry to
(``api/jobs_service.py``) right after its UPDATE, and wakes on that entry. The heartbeat
sets the same signal when it finds the job no longer ours, so a lost bus message costs
at most one heartbeat interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from storage.bus import EventBus
from storage.constants import job_events_key

log = logging.getLogger(__name__)

BLOCK_MS = 1000  # one XREAD's wait; also how long the thread outlives its job at most


class StopWatch:
    def __init__(
        self, bus: EventBus | None, job_id: str, after: str | None, stop: Callable[[], None]
    ) -> None:
        self._stop = stop  # called when the job is no longer ours to run
        self._done = threading.Event()  # set: the job ended, stop watching
        self._bus = bus
        self._key = job_events_key(job_id)
        self._after = after

    def start(self) -> StopWatch:
        if self._bus is not None and self._after is not None:
            name = f"stopwatch-{self._key}"
            threading.Thread(target=self._watch, name=name, daemon=True).start()
        return self

    def close(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        assert self._bus is not None and self._after is not None
        after = self._after
        while not self._done.is_set():
            try:
                entries = self._bus.read(self._key, after, block_ms=BLOCK_MS)
            except Exception:
                log.warning("stop watch of %s: bus read failed", self._key, exc_info=True)
                self._done.wait(BLOCK_MS / 1000)
                continue
            for entry in entries:
                after = entry.id
                if entry.type == "done" and entry.event.get("status") != "completed":
                    self._stop()
                    return
