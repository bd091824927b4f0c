"""Which workers are alive, per model, and which could not load it.

**Presence.** A sorted set per model in Redis, one member per worker scored by its
lease's expiry (on Redis' clock, one clock for every host). A worker renews its lease for
the models it loaded every ``OMNIQ_WORKER__HEARTBEAT_S`` and removes it when it stops; a
worker that was killed drops out once its lease (``heartbeat_timeout_s``) runs out. The
API reads the count to know how many jobs of a model can run at once, for
``estimated_start_at`` and ``Retry-After`` (``api/queue_admission.py``). A worker group
is one worker: its rank 0 takes the jobs. A worker that runs k jobs of a model at once
(``OMNIQ_WORKER__BATCH_SIZE``, its steps batched) holds k members (its id, then
``<id>#2`` … ``<id>#k``), so it counts as k. Realtime workers hold leases for their
streaming models too (nothing counts them for estimates).

**Load failures.** A hash per model, one field per worker that could not load it (its
``slot``: host and worker name, the same across the worker's restarts), whose value is
the record's expiry and a one-line reason (``workers/pipelines/load_failure.py``). A
live worker renews its records with its lease; a worker that loaded nothing and exits
leaves them for ``OMNIQ_WORKER__LOAD_FAILURE_TTL_S``, so the API goes on saying why; a
worker that loads the model drops its slot's record. A model is **unavailable**
(:attr:`Availability.reason`) while it has records and no live worker: the API refuses
its creates (503 ``model_unavailable``) and the reconciler fails its queued jobs.

**Memory reports.** A worker that loaded a model with a memory plan (FP8 weights,
offloading) keeps what it did (``models.memory_plan.MemoryReport``) in a key per model,
written with its lease and lasting as long; ``/v1/models`` lists the last one a live
worker wrote (every worker of a model loads the same entry, so they write the same).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from models.memory_plan import MemoryReport
from storage.constants import load_failures_key, memory_key, presence_key

log = logging.getLogger(__name__)

# KEYS: (presence, failures) of each served model, then the failures of each failed one.
# ARGV: lease_s, worker id, slot ('': none), served count, the jobs the worker runs at once
# of each served model, then a reason per failed model.
_RENEW = """
local t = redis.call('TIME')
local lease = tonumber(ARGV[1])
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1000000 + lease
local served = tonumber(ARGV[4])
for i = 1, served do
  local key = KEYS[2 * i - 1]
  redis.call('ZADD', key, expiry, ARGV[2])
  for j = 2, tonumber(ARGV[4 + i]) do
    redis.call('ZADD', key, expiry, ARGV[2] .. '#' .. j)
  end
  redis.call('EXPIRE', key, math.ceil(lease))
  if ARGV[3] ~= '' then redis.call('HDEL', KEYS[2 * i], ARGV[3]) end
end
for i = 2 * served + 1, #KEYS do
  local key = KEYS[i]
  local reason = ARGV[4 + served + i - 2 * served]
  redis.call('HSET', key, ARGV[3], string.format('%.3f', expiry) .. ' ' .. reason)
  if redis.call('TTL', key) < lease then redis.call('EXPIRE', key, math.ceil(lease)) end
end
return 1
"""
_COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""
# KEYS: (presence, failures) of each model → {live workers, {reasons of live records}}.
_AVAILABILITY = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {}
for i = 1, #KEYS, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  local reasons = {}
  local records = redis.call('HGETALL', KEYS[i + 1])
  for j = 1, #records, 2 do
    local until_s, reason = string.match(records[j + 1], '^(%S+) (.*)$')
    if until_s and tonumber(until_s) > now then
      table.insert(reasons, reason)
    else
      redis.call('HDEL', KEYS[i + 1], records[j])
    end
  end
  table.insert(out, {redis.call('ZCARD', KEYS[i]), reasons})
end
return out
"""


@dataclass(frozen=True, slots=True)
class Availability:
    """What the workers say of one model: how many live ones serve it, and the reasons
    of those that could not load it (live, or gone within the records' keep time)."""

    workers: int
    failures: tuple[str, ...] = ()

    @property
    def reason(self) -> str | None:
        """Why no live worker can load the model (its distinct reasons, ``; ``-joined,
        three at most);
        None while one serves it, or while none has failed to (nothing known: a job waits
        for a worker, as it always did)."""
        if self.workers or not self.failures:
            return None
        distinct = sorted(set(self.failures))
        more = f"; and {len(distinct) - 3} more" if len(distinct) > 3 else ""
        return "; ".join(distinct[:3]) + more


class WorkerPresence:
    """Leases of live job workers on a (blocking) Redis client."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._renew = redis.register_script(_RENEW)
        self._count = redis.register_script(_COUNT)
        self._availability = redis.register_script(_AVAILABILITY)

    def renew(
        self,
        models: Iterable[str],
        worker_id: str,
        lease_s: float,
        failed: Mapping[str, str] | None = None,
        slot: str = "",
        jobs: Mapping[str, int] | None = None,
    ) -> None:
        """Hold ``worker_id``'s lease on ``models`` for ``lease_s`` and, given its
        ``slot``, drop that slot's load failures of them; record (or keep) ``failed``
        (model → one-line reason) under ``slot`` for as long. ``jobs``: how many jobs of
        a model the worker runs at once, where more than 1 (a worker that batches them:
        its lease counts as that many workers, ``worker_id#2`` …)."""
        served = list(models)
        failed = dict(failed or {})
        if failed and not slot:
            raise ValueError("load failures are recorded under a worker's slot")
        keys = [k for m in served for k in (presence_key(m), load_failures_key(m))]
        keys += [load_failures_key(m) for m in failed]
        if keys:
            at_once = [max(1, (jobs or {}).get(m, 1)) for m in served]
            args = [lease_s, worker_id, slot, len(served), *at_once, *failed.values()]
            self._renew(keys=keys, args=args)

    def leave(
        self,
        models: Iterable[str],
        worker_id: str,
        failed: Iterable[str] = (),
        slot: str = "",
        jobs: Mapping[str, int] | None = None,
    ) -> None:
        for model in models:
            more = [f"{worker_id}#{j}" for j in range(2, (jobs or {}).get(model, 1) + 1)]
            self._redis.zrem(presence_key(model), worker_id, *more)
        for model in failed:
            self._redis.hdel(load_failures_key(model), slot)

    def report_memory(self, reports: Mapping[str, MemoryReport], lease_s: float) -> None:
        """Keep each model's memory report for ``lease_s`` (a worker's, renewed with its
        lease)."""
        if not reports:
            return
        pipe = self._redis.pipeline(transaction=False)
        for model, report in reports.items():
            pipe.set(memory_key(model), report.model_dump_json(), ex=max(1, math.ceil(lease_s)))
        pipe.execute()

    def memory_reports(self, models: Iterable[str]) -> dict[str, MemoryReport]:
        """The memory reports live workers keep of ``models`` (those that have one)."""
        names = list(models)
        if not names:
            return {}
        values = self._redis.mget([memory_key(m) for m in names])
        return {
            name: MemoryReport.model_validate_json(value)
            for name, value in zip(names, values, strict=True)
            if value is not None
        }

    def count(self, model: str) -> int:
        """Workers of ``model`` whose lease has not run out (a worker that runs k of its
        jobs at once counts k times)."""
        return int(self._count(keys=[presence_key(model)]))

    def availability(self, models: Iterable[str]) -> dict[str, Availability]:
        """Each model's live workers and live load-failure records, in one round trip."""
        names = list(models)
        if not names:
            return {}
        keys = [k for m in names for k in (presence_key(m), load_failures_key(m))]
        rows = self._availability(keys=keys)
        return {
            name: Availability(int(count), tuple(_text(r) for r in reasons))
            for name, (count, reasons) in zip(names, rows, strict=True)
        }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class PresenceLease:
    """This worker's lease on the models it loaded, and its records of those it could
    not load (``failed``, under its ``slot``), renewed every ``every_s`` by a daemon
    thread until :meth:`stop`, which removes both; with them the ``memory`` reports of
    the models it loaded with a plan (left to lapse when it stops)."""

    def __init__(
        self,
        presence: WorkerPresence,
        models: list[str],
        worker_id: str,
        *,
        every_s: float,
        lease_s: float,
        failed: Mapping[str, str] | None = None,
        slot: str = "",
        memory: Mapping[str, MemoryReport] | None = None,
        jobs: Mapping[str, int] | None = None,
    ) -> None:
        self._stop = threading.Event()
        self._jobs = dict(jobs or {})  # jobs at once per model, where more than 1
        self._presence = presence
        self._models = list(models)
        self._worker_id = worker_id
        self._every_s = every_s
        self._lease_s = lease_s
        self._failed = dict(failed or {})
        self._slot = slot
        self._memory = dict(memory or {})
        self._thread = threading.Thread(target=self._loop, name="presence", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._presence.renew(
                    self._models,
                    self._worker_id,
                    self._lease_s,
                    self._failed,
                    self._slot,
                    self._jobs,
                )
                self._presence.report_memory(self._memory, self._lease_s)
            except RedisError:
                log.warning("could not renew this worker's presence", exc_info=True)
            self._stop.wait(self._every_s)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        try:
            self._presence.leave(
                self._models, self._worker_id, self._failed, self._slot, self._jobs
            )
        except RedisError:  # its lease runs out on its own
            log.warning("could not remove this worker's presence")
