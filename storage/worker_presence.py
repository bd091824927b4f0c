"""Which job workers are alive, per model: a sorted set per model in Redis, one member
per worker scored by its lease's expiry (on Redis' clock, one clock for every host).

A job worker renews its lease every ``OMNIQ_WORKER__HEARTBEAT_S`` and removes it when it
stops; a worker that was killed drops out once its lease (``heartbeat_timeout_s``) runs
out. The API reads the count to know how many jobs of a model can run at once, for
``estimated_start_at`` and ``Retry-After`` (``api/queue_admission.py``). A worker group
is one worker: its rank 0 takes the jobs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisError

from storage.constants import KEY_PREFIX

log = logging.getLogger(__name__)

_RENEW = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, expiry, ARGV[2])
  redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[1])))
end
return 1
"""
_COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


def presence_key(model: str) -> str:
    return f"{KEY_PREFIX}workers:{model}"


class WorkerPresence:
    """Leases of live job workers on a (blocking) Redis client."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._renew = redis.register_script(_RENEW)
        self._count = redis.register_script(_COUNT)

    def renew(self, models: Iterable[str], worker_id: str, lease_s: float) -> None:
        keys = [presence_key(m) for m in models]
        if keys:
            self._renew(keys=keys, args=[lease_s, worker_id])

    def leave(self, models: Iterable[str], worker_id: str) -> None:
        for model in models:
            self._redis.zrem(presence_key(model), worker_id)

    def count(self, model: str) -> int:
        """Workers of ``model`` whose lease has not run out."""
        return int(self._count(keys=[presence_key(model)]))


class PresenceLease:
    """This worker's lease, renewed every ``every_s`` by a daemon thread until
    :meth:`stop`, which removes it."""

    def __init__(
        self,
        presence: WorkerPresence,
        models: list[str],
        worker_id: str,
        *,
        every_s: float,
        lease_s: float,
    ) -> None:
        self._stop = threading.Event()
        self._args = (presence, models, worker_id, every_s, lease_s)
        self._thread = threading.Thread(target=self._loop, name="presence", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        presence, models, worker_id, every_s, lease_s = self._args
        while not self._stop.is_set():
            try:
                presence.renew(models, worker_id, lease_s)
            except RedisError:
                log.warning("could not renew this worker's presence", exc_info=True)
            self._stop.wait(every_s)

    def stop(self, timeout: float = 5.0) -> None:
        presence, models, worker_id, _, _ = self._args
        self._stop.set()
        self._thread.join(timeout)
        try:
            presence.leave(models, worker_id)
        except RedisError:  # its lease runs out on its own
            log.warning("could not remove this worker's presence")
