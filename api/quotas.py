"""Per-key quotas, enforced before anything of a request is stored (``docs/limits.md``).

Three limits, each a server default (``OMNIQ_QUOTAS__*``) that a key's own value
(``omniqueue keys create/update``, the ``api_keys`` columns) overrides; 0 is unlimited:

- **creates per minute**: a moving window per key in Redis, kept by the ``limits``
  library (its Lua scripts make hit-and-count atomic, so every API replica shares one
  exact window). Every create request counts, as OpenAI counts requests. Creates answer
  ``x-ratelimit-limit-requests`` / ``-remaining-requests`` / ``-reset-requests`` (reset
  as OpenAI writes durations: ``12ms``, ``1s``, ``6m0s``): the time until the oldest
  request of the window leaves it, i.e. until one more create is allowed.
- **active jobs** (queued + in progress): counted in the database, the source of truth,
  with one COUNT on the ``(owner, status)`` index, in the thread-pool call that stores
  the job (after the idempotency lookup, so a retried create of a job that exists gets
  that job, not a 429). A Redis counter kept in step would need a decrement on every
  way a job ends (worker, cancel, delete, reconciler, a crash between two of them) and
  drifts when one is missed; the COUNT cannot drift. It is not a lock: creates of one
  key racing at the same instant can pass it together (at most one job over per
  concurrent create).
- **concurrent realtime sessions** (voice and world): a sorted set per key in Redis,
  one member per connected socket scored by its lease's expiry; the serving replica
  refreshes the lease while the socket is open and removes it when the socket ends, so
  the sessions of a replica that was killed expire within :data:`SESSION_LEASE_S`.

A key with every limit at 0 costs nothing here: no Redis command, no COUNT.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from limits import RateLimitItemPerMinute
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.exceptions import RedisError

from api.errors import broker_unavailable
from models.db import ApiKey
from models.errors import RateLimited
from storage.constants import KEY_PREFIX, quota_sessions_key
from storage.jobs import JobStore
from storage.settings import Settings

# A session's lease in the per-key set lasts this long; it is renewed every third of it.
SESSION_LEASE_S = 30.0

# Prune expired leases, refuse at the limit, else add ours: atomic, on Redis' clock (one
# clock for every replica).
_ADMIT_SESSION = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])))
return 1
"""
_RENEW_SESSION = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])))
return 1
"""


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """The quotas that apply to one key (0: unlimited)."""

    creates_per_minute: int = 0
    max_active_jobs: int = 0
    max_sessions: int = 0


def go_duration(seconds: float) -> str:
    """``seconds`` as OpenAI's ``x-ratelimit-reset-*`` headers write a duration (Go's
    ``time.Duration`` text): ``250ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h0m0s``."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:g}s"
    whole = math.ceil(ms / 1000)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"


def ratelimit_headers(limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(max(0, remaining)),
        "x-ratelimit-reset-requests": go_duration(reset_s),
    }


class Quotas:
    """The quota checks of one API process (built at startup, on its asyncio Redis)."""

    def __init__(
        self, settings: Settings, aredis: Any, *, session_lease_s: float = SESSION_LEASE_S
    ) -> None:
        self.defaults = settings.quotas
        self.timeout_s = settings.redis.command_timeout_s
        self.session_lease_s = session_lease_s
        self._redis = aredis
        # The limits library on our client's connection pool (no second pool).
        storage = RedisStorage(
            "async+" + settings.redis.url,
            implementation="redispy",
            key_prefix=KEY_PREFIX + "quota",
            connection_pool=aredis.connection_pool,
        )
        self._window = MovingWindowRateLimiter(storage)
        self._admit = aredis.register_script(_ADMIT_SESSION)
        self._renew = aredis.register_script(_RENEW_SESSION)

    def limits_for(self, key: ApiKey | None) -> KeyLimits:
        """The key's quotas: its own value where it has one, else the server default
        (``key`` None: auth is off, the defaults apply to everyone as one caller)."""
        d = self.defaults

        def pick(own: int | None, default: int) -> int:
            return default if own is None else own

        if key is None:
            return KeyLimits(d.creates_per_minute, d.max_active_jobs, d.max_sessions)
        return KeyLimits(
            pick(key.creates_per_minute, d.creates_per_minute),
            pick(key.max_active_jobs, d.max_active_jobs),
            pick(key.max_sessions, d.max_sessions),
        )

    # ---- creates ------------------------------------------------------------------

    async def admit_create(self, owner: str, limits: KeyLimits) -> dict[str, str]:
        """Count one create of ``owner``; the ``x-ratelimit-*`` headers of its answer
        (none without a creates-per-minute limit), or :class:`RateLimited` (429) when
        the minute's creates are used up."""
        limit = limits.creates_per_minute
        if not limit:
            return {}
        item = RateLimitItemPerMinute(limit)
        try:
            with anyio.fail_after(self.timeout_s):
                allowed = await self._window.hit(item, owner)
                stats = await self._window.get_window_stats(item, owner)
        except (RedisError, TimeoutError) as exc:
            raise broker_unavailable() from exc
        wait = max(0.0, stats.reset_time - time.time())
        headers = ratelimit_headers(limit, stats.remaining, wait)
        if allowed:
            return headers
        retry = max(1, math.ceil(wait))
        raise RateLimited(
            f"rate limit reached: this key may create {limit} jobs per minute "
            f"(creates_per_minute); try again in {retry} s",
            param="creates_per_minute",
            headers={**headers, "Retry-After": str(retry)},
        )

    def check_active(self, jobs: JobStore, owner: str, limit: int) -> None:
        """:class:`RateLimited` when ``owner`` already has ``limit`` jobs queued or
        running (blocking: one indexed COUNT; call it where the job is stored)."""
        active = jobs.count_active(owner)
        if active < limit:
            return
        retry = self.defaults.active_retry_after_s
        raise RateLimited(
            f"this key has {active} jobs queued or in progress, its limit "
            f"(max_active_jobs) is {limit}; try again once one of them has ended",
            param="max_active_jobs",
            headers={"Retry-After": str(retry)},
        )

    # ---- realtime sessions --------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session_lease(self, owner: str, limit: int) -> AsyncIterator[bool]:
        """Hold one of ``owner``'s ``limit`` session places for the block: True when
        admitted (the lease is renewed meanwhile and dropped on the way out), False when
        the key's sessions are all taken. Unlimited (0): True, no Redis command."""
        if not limit:
            yield True
            return
        key = quota_sessions_key(owner)
        member = secrets.token_hex(8)
        try:
            with anyio.fail_after(self.timeout_s):
                admitted = await self._admit(keys=[key], args=[limit, self.session_lease_s, member])
        except (RedisError, TimeoutError) as exc:
            raise broker_unavailable() from exc
        if not admitted:
            yield False
            return
        renewal = asyncio.create_task(self._keep(key, member))
        try:
            yield True
        finally:
            renewal.cancel()
            with anyio.CancelScope(shield=True), contextlib.suppress(RedisError, TimeoutError):
                with anyio.fail_after(self.timeout_s):
                    await self._redis.zrem(key, member)

    async def _keep(self, key: str, member: str) -> None:
        while True:
            await asyncio.sleep(self.session_lease_s / 3)
            try:
                with anyio.fail_after(self.timeout_s):
                    await self._renew(keys=[key], args=[self.session_lease_s, member])
            except (RedisError, TimeoutError):  # retried at the next beat; lapses if Redis is gone
                continue
