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

The lease is renewed through a connection of its own and, where the server lets another
connection see it, names that connection's client id (``storage/session_lease.py``): a
process that dies closes it at once, and the API, finding the client gone, need not wait
for the TTL. A connection that dropped and came back is named again by the next renew.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from types import TracebackType
from typing import Any

import redis
import redis.exceptions

from storage.constants import session_lease_key
from storage.session_lease import lease_value

log = logging.getLogger(__name__)


class SessionLease:
    """``with SessionLease(…):`` holds the lease while the block runs (nothing at all
    when ``lease_s`` is 0); ``bind``: name its connection in it, where the server allows."""

    def __init__(
        self,
        redis: Any,
        session_id: str,
        attempt: int,
        holder: str,
        *,
        lease_s: float,
        every_s: float,
        bind: bool = True,
    ) -> None:
        self.redis = redis
        self.key = session_lease_key(session_id, attempt)
        self.holder = holder
        self.lease_ms = round(lease_s * 1000)
        self.every_s = min(every_s, lease_s / 3)
        self.bind = bind
        self.client_id: int | None = None  # the connection the lease is bound to
        self._own: Any = None  # the lease's own client, one connection
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SessionLease:
        if self.lease_ms > 0:
            self._own = _one_connection(self.redis)
            try:
                if self.bind:
                    self.client_id = self._visible_id()
                self._renew()
            except BaseException:
                self._own.close()
                raise
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
            self._own.delete(self.key)
        self._own.close()

    def _visible_id(self) -> int | None:
        """The lease's connection's client id, if another connection of the worker sees
        it: a proxy that shows each connection a server of its own, or an ACL that
        refuses ``CLIENT``, leaves the lease to its TTL."""
        try:
            client_id = int(self._own.client_id())
            seen = self.redis.client_list(client_id=[client_id])
        except redis.exceptions.ResponseError as exc:
            log.info("lease %s not bound to its connection: %s", self.key, exc)
            return None
        return client_id if seen else None

    def _renew(self) -> None:
        """Set the lease for its TTL; bound, with the id of the connection that set it
        (asked in the same round trip: one that changed is written again at once)."""
        if self.client_id is None:
            self._own.set(self.key, self.holder, px=self.lease_ms)
            return
        for _ in range(3):
            pipe = self._own.pipeline(transaction=False)
            pipe.client_id()
            pipe.set(self.key, lease_value(self.holder, self.client_id), px=self.lease_ms)
            client_id, _ = pipe.execute()
            if client_id == self.client_id:
                return
            self.client_id = client_id  # connected again since the last renew

    def _keep(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._renew()
            except redis.exceptions.RedisError as exc:  # the session's own calls fail too
                log.debug("lease %s not renewed: %s", self.key, exc)


def _one_connection(client: Any) -> redis.Redis:
    """A client of one connection to ``client``'s server, with its settings: the lease's
    client id is that connection's, and no session call waits behind it."""
    pool = client.connection_pool
    own = redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=1, **pool.connection_kwargs
    )
    return redis.Redis.from_pool(own)
