"""A realtime worker's lease on a session it runs: proof that its process lives, which
the API reads to tell a dead worker from a busy one at once (``realtime/worker_watch.py``).

A session's own keep-alives go out between model steps, so a long step (a VAE decode, a
compile) silences them for seconds and the API must wait ``lost_after_s`` before it calls
the worker lost. The lease is renewed by a thread of its own instead, every
``keepalive_s`` whatever the session thread does, with a TTL of ``worker_lease_s``: when
it runs out the process is gone (SIGKILL, OOM killer, a lost host), and the API ends the
session, or has another worker take it over, without waiting. One key per placement
(``attempt``), so the lease of a worker presumed dead never stands for the worker that
took its session over.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from types import TracebackType
from typing import Any

import redis.exceptions

from storage.constants import session_lease_key

log = logging.getLogger(__name__)


class SessionLease:
    """``with SessionLease(…):`` holds the lease while the block runs (nothing at all
    when ``lease_s`` is 0)."""

    def __init__(
        self,
        redis: Any,
        session_id: str,
        attempt: int,
        holder: str,
        *,
        lease_s: float,
        every_s: float,
    ) -> None:
        self.redis = redis
        self.key = session_lease_key(session_id, attempt)
        self.holder = holder
        self.lease_ms = round(lease_s * 1000)
        self.every_s = min(every_s, lease_s / 3)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SessionLease:
        if self.lease_ms > 0:
            self._renew()
            self._thread = threading.Thread(
                target=self._keep, name=f"lease-{self.key}", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(redis.exceptions.RedisError):  # else it runs out
            self.redis.delete(self.key)

    def _renew(self) -> None:
        self.redis.set(self.key, self.holder, px=self.lease_ms)

    def _keep(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._renew()
            except redis.exceptions.RedisError as exc:  # the session's own calls fail too
                log.debug("lease %s not renewed: %s", self.key, exc)
