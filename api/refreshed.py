"""A figure an API process re-reads at most every so often, answering from what it read
meanwhile: which models no live worker can load (``api/model_availability.py``), each
model's queue figures (``api/queue_admission.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Refreshed(Generic[T]):
    """What ``read(now)`` gave, read again once ``max_age_s`` old (by ``clock``). One
    thread reads when it is stale; the others meanwhile take the previous value, and wait
    only for the first read. ``read`` should not raise: after a failure it gives what to
    keep until the next refresh (a failed read counts as one). Figures that share a
    ``lock`` are read one at a time."""

    def __init__(
        self,
        read: Callable[[float], T],
        max_age_s: float,
        clock: Callable[[], float],
        lock: threading.Lock | None = None,
    ) -> None:
        self._read = read
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock() if lock is None else lock
        self._last: tuple[float, T] | None = None  # (read at, value)

    def get(self) -> T:
        now = self._clock()
        last = self._last
        if last is None:
            self._lock.acquire()
        elif now - last[0] < self._max_age_s or not self._lock.acquire(blocking=False):
            return last[1]
        try:
            last = self._last
            if last is None or now - last[0] >= self._max_age_s:
                last = self._last = (now, self._read(now))
            return last[1]
        finally:
            self._lock.release()

    def last(self) -> T | None:
        """What the last read gave (None before the first), without reading."""
        return None if self._last is None else self._last[1]
