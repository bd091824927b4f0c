"""Which served models no live worker can load, as the API sees them.

A worker that cannot load a model records why with its presence
(``storage/worker_presence.py``); a model with such records and no live worker is
unavailable. The API reads every served model's figures in one Redis round trip, at most
every ``refresh_s`` per process, and uses them three ways:

- a create for an unavailable model is refused before anything is stored: 503
  ``model_unavailable``, ``param`` ``model``, the workers' reasons in the message
  (:meth:`ModelAvailability.check`, run where the job is stored:
  :meth:`api.jobs_service.JobService.insert`);
- ``GET /v1/models`` lists it with ``available: false`` and ``unavailable_reason``;
- ``/ready`` names it in ``unavailable_models`` (and stays 200: the API serves the
  other models).

The same reads give, for ``GET /v1/models``' ``memory``, what the live workers that
loaded a model with a memory plan (FP8 weights, offloading) report of it
(:meth:`ModelAvailability.memory`).

A failed read (Redis down) gives the last figures read, or none: a create is then
never refused for a model, and its job waits for a worker as it did before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from api.refreshed import Refreshed
from models.errors import ModelUnavailable
from models.memory_plan import MemoryReport
from storage.worker_presence import WorkerPresence

log = logging.getLogger(__name__)

# How long an API process keeps what it read (seconds).
REFRESH_S = 1.0


class ModelAvailability:
    """Each served model's reason to be unavailable, cached per API process."""

    def __init__(
        self,
        presence: WorkerPresence,
        models: list[str],
        *,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._presence = presence
        self._models = list(models)
        self._reasons = Refreshed(self._read, refresh_s, clock)
        self._memory = Refreshed(self._read_memory, refresh_s, clock)

    def unavailable(self) -> dict[str, str]:
        """Served models that no live worker can load → why (blocking: Redis). One
        thread reads when the figures are stale; the others meanwhile take the previous
        ones (none before the first read)."""
        return self._reasons.get()

    def last(self) -> dict[str, str]:
        """What the last read found, without reading."""
        return self._reasons.last() or {}

    def _read(self, _now: float) -> dict[str, str]:
        try:
            figures = self._presence.availability(self._models)
        except Exception as exc:  # never worth refusing a create over (nor a traceback)
            log.warning("could not read which models the workers can load: %r", exc)
            return self.last()
        return {m: a.reason for m, a in figures.items() if a.reason is not None}

    def memory(self) -> dict[str, MemoryReport]:
        """Served models' memory reports, as live workers keep them (blocking: Redis,
        cached as :meth:`unavailable` is; none after a failed read)."""
        return self._memory.get()

    def _read_memory(self, _now: float) -> dict[str, MemoryReport]:
        try:
            return self._presence.memory_reports(self._models)
        except Exception as exc:  # a listing without the figures, never a failed one
            log.warning("could not read the workers' memory reports: %r", exc)
            return {}

    def check(self, model: str) -> None:
        """Refuse (:class:`ModelUnavailable`) a create for ``model`` when no live worker
        can load it."""
        reason = self.unavailable().get(model)
        if reason is not None:
            raise ModelUnavailable(model, reason)
