"""A realtime worker's lease on a session as Redis holds it: the value its worker writes
(``workers/sessions/lease.py``) and the API's look at it (``api/realtime/relay.py``).

The key (``storage.constants.session_lease_key``) lives while the worker renews it, with a
TTL. Its value is the worker's id and, where the lease is bound to its connection,
``client=<id>``: the Redis client id of the connection that renews it, one the lease holds
for itself. A process that dies (SIGKILL, the OOM killer, a crash) closes its sockets at
once and Redis drops the client with it, so the API sees the death in one ``CLIENT LIST
ID`` (O(1) per id; Redis 6.2 and later, Valkey) instead of a TTL later: 3.6 s of a 5.4 s
takeover on an H100 was that wait (docs/PERFORMANCE.md). A host that vanishes closes
nothing; its client lingers on the server and the TTL finds it, as before.

A connection can also drop while its worker lives (a ``CLIENT KILL``, a reset link): the
worker's next renew names its new connection. The API looks only at a worker that is
silent too (``realtime/worker_watch.py``), and a world session taken over from a worker
wrongly presumed dead loses nothing: the old worker's next chunk is refused by the fence
(``storage/session_checkpoint.py``) and it ends without a word.

Where ``CLIENT LIST`` is refused (an ACL without ``@admin``, a proxy), the API says so in
the log once and goes by the TTL alone.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

CLIENT_FIELD = " client="


def lease_value(holder: str, client_id: int | None) -> str:
    """The value a worker writes: its id, then the client id its lease is bound to."""
    return holder if client_id is None else f"{holder}{CLIENT_FIELD}{client_id}"


def parse_lease(value: bytes | str) -> tuple[str, int | None]:
    """``(holder, client id or None)`` of a lease's value."""
    text = value.decode() if isinstance(value, bytes) else value
    holder, found, client = text.rpartition(CLIENT_FIELD)
    if not found or not client.isdigit():
        return text, None
    return holder, int(client)


class LeaseLook:
    """The API's look at one session's worker leases, on its asyncio Redis client."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.refused = False  # CLIENT LIST was refused: the TTL alone

    async def held(self, key: str) -> bool:
        """False when the lease ran out, or when the connection it is bound to is gone."""
        value = await self.redis.get(key)
        if value is None:
            return False
        _, client_id = parse_lease(value)
        if client_id is None or self.refused:
            return True
        try:
            return bool(await self.redis.client_list(client_id=[client_id]))
        except ResponseError as exc:  # NOPERM, an unknown command behind a proxy
            self.refused = True
            _say_refused(type(exc).__name__)
            return True


@functools.cache
def _say_refused(reason: str) -> None:
    """Once per process (and kind of refusal): every session's relay meets it."""
    log.warning("CLIENT LIST refused (%s): worker leases go by their TTL only", reason)
