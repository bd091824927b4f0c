"""The event bus: Redis Streams, one per job or session direction.

Each entry holds a model as JSON in ``event`` (``model_dump_json``: no dict crosses a
process boundary) and optionally raw binary ``data``; the stream id (e.g.
``1764460000123-0``) is the event's id on the wire, so a watcher resumes by passing the
last id it saw (SSE ``Last-Event-ID``). ``read`` returns the JSON decoded (job watchers
forward it as it is); ``read_as`` parses each entry into one model of a union with that
union's module-level ``TypeAdapter`` (the session streams of ``models/session_bus.py``).
Streams are bounded (``MAXLEN ~``) and expire ``ttl_s`` after their last entry, so
nothing outlives its retention. The worker publishes with the synchronous
:class:`EventBus`; the API reads with :class:`AsyncEventBus`.

A job's worker publishes fenced by its run's ``attempt`` (:data:`FENCED_XADD`): an entry
is refused when the stream's last entry is a ``done`` or came from a later attempt, so a
worker cut off, presumed dead and taken over (a zombie) adds nothing once it is back, and
nothing follows the end of a job.

The asyncio client has no per-command socket timeout (see ``api/state.py``); request-path
callers pass ``timeout_s`` instead, which arms one timer around that call only and turns
a dead or stalled Redis into :class:`BusUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis.exceptions
from pydantic import BaseModel, TypeAdapter

from models.errors import BusUnavailable

DEFAULT_MAXLEN = 2000
T = TypeVar("T")


@asynccontextmanager
async def _bounded(timeout_s: float) -> AsyncIterator[None]:
    """A deadline; Redis errors and the deadline both become :class:`BusUnavailable`.
    redis-py drops a connection whose command was interrupted, so the pool stays
    consistent."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except (TimeoutError, redis.exceptions.RedisError, OSError) as exc:
        raise BusUnavailable(type(exc).__name__) from exc


@dataclass(frozen=True)
class BusEntry:
    id: str
    event: dict[str, Any]
    data: bytes | None = None

    @property
    def type(self) -> str:
        return str(self.event.get("type", ""))


@dataclass(frozen=True, slots=True)
class BusMessage(Generic[T]):
    """An entry parsed by :meth:`EventBus.read_as`: ``event`` is a model, ``data`` raw."""

    id: str
    event: T
    data: bytes | None = None


# KEYS[1] the stream; ARGV: attempt, maxlen, ttl, then the entry's field/value pairs.
# Refuses (nil) when the last entry is a job's end (``final``) or from a later attempt.
FENCED_XADD = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if last then
  local f = last[2]
  for i = 1, #f, 2 do
    if f[i] == 'final' then return false end
    if f[i] == 'attempt' and tonumber(f[i + 1]) > tonumber(ARGV[1]) then return false end
  end
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[3])
return id
"""


def entry_fields(event: BaseModel, data: bytes | None) -> dict[str, Any]:
    """An entry: the event's JSON, its binary ``data``, and ``final`` on a job's ``done``
    (what :data:`FENCED_XADD` refuses to follow)."""
    fields: dict[str, Any] = {"event": event.model_dump_json()}
    if data is not None:
        fields["data"] = data
    if getattr(event, "type", None) == "done":
        fields["final"] = 1
    return fields


def _id(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def _entries(raw: Any) -> list[BusEntry]:
    return [BusEntry(_id(i), json.loads(f[b"event"]), f.get(b"data")) for i, f in raw]


def _messages(raw: Any, adapter: TypeAdapter[T]) -> list[BusMessage[T]]:
    parse = adapter.validate_json
    return [BusMessage(_id(i), parse(f[b"event"]), f.get(b"data")) for i, f in raw]


class EventBus:
    """Synchronous publisher/reader (workers)."""

    def __init__(
        self, redis: Any, *, ttl_s: int, maxlen: int = DEFAULT_MAXLEN, backoff_s: float = 0.0
    ) -> None:
        """``backoff_s``: after a fenced publish fails, the next ones within this long fail
        at once (:class:`BusUnavailable`) instead of each waiting for the dead link's
        timeout: a job's events are best effort, and its worker goes on at full speed
        while the bus is unreachable (its watchers fall back to the job's row)."""
        self.redis = redis
        self.ttl_s = ttl_s
        self.maxlen = maxlen
        self.backoff_s = backoff_s
        self._failed_at = float("-inf")
        self._fenced = redis.register_script(FENCED_XADD)

    def publish(self, stream: str, event: BaseModel, data: bytes | None = None) -> str:
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(stream, entry_fields(event, data), maxlen=self.maxlen, approximate=True)
        pipe.expire(stream, self.ttl_s)
        entry_id, _ = pipe.execute()
        return _id(entry_id)

    def publish_fenced(
        self, stream: str, event: BaseModel, data: bytes | None = None, *, attempt: int
    ) -> str | None:
        """:meth:`publish` for attempt ``attempt`` of a job (its worker): None when
        refused because the job ended or a later attempt took it over."""
        if time.monotonic() - self._failed_at < self.backoff_s:
            raise BusUnavailable("the event bus failed just before; not trying yet")
        fields = {**entry_fields(event, data), "attempt": attempt}
        flat = [part for pair in fields.items() for part in pair]
        try:
            entry_id = self._fenced(keys=[stream], args=[attempt, self.maxlen, self.ttl_s, *flat])
        except redis.exceptions.RedisError:
            self._failed_at = time.monotonic()
            raise
        return None if entry_id is None else _id(entry_id)

    def publish_many(self, stream: str, events: Sequence[tuple[BaseModel, bytes | None]]) -> None:
        """Publish several events in one round trip; readers see them together (one
        MULTI/EXEC: without it Redis serves a blocked ``XREAD`` after the first ``XADD``
        of a pipeline, and a voice answer's prebuffer burst reached the client split)."""
        if not events:
            return
        pipe = self.redis.pipeline(transaction=True)
        for event, data in events:
            pipe.xadd(stream, entry_fields(event, data), maxlen=self.maxlen, approximate=True)
        pipe.expire(stream, self.ttl_s)
        pipe.execute()

    def read(
        self, stream: str, after: str = "0-0", *, block_ms: int | None = None, count: int = 100
    ) -> list[BusEntry]:
        raw = self.redis.xread({stream: after}, count=count, block=block_ms)
        return _entries(raw[0][1]) if raw else []

    def read_as(
        self,
        adapter: TypeAdapter[T],
        stream: str,
        after: str = "0-0",
        *,
        block_ms: int | None = None,
        count: int = 100,
    ) -> list[BusMessage[T]]:
        """:meth:`read`, each entry parsed by ``adapter`` (a ``ValidationError`` if not)."""
        raw = self.redis.xread({stream: after}, count=count, block=block_ms)
        return _messages(raw[0][1], adapter) if raw else []

    def delete(self, *streams: str) -> None:
        if streams:
            self.redis.delete(*streams)


class AsyncEventBus:
    """asyncio publisher/reader (the API)."""

    def __init__(self, redis: Any, *, ttl_s: int, maxlen: int = DEFAULT_MAXLEN) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.maxlen = maxlen

    async def publish(
        self,
        stream: str,
        event: BaseModel,
        data: bytes | None = None,
        *,
        timeout_s: float | None = None,
    ) -> str:
        if timeout_s is None:  # the realtime hot path: no timer, no wrapper
            return await self._publish(stream, event, data)
        async with _bounded(timeout_s):
            return await self._publish(stream, event, data)

    async def _publish(self, stream: str, event: BaseModel, data: bytes | None) -> str:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(stream, entry_fields(event, data), maxlen=self.maxlen, approximate=True)
            pipe.expire(stream, self.ttl_s)
            entry_id, _ = await pipe.execute()
        return _id(entry_id)

    async def read(
        self,
        stream: str,
        after: str = "0-0",
        *,
        block_ms: int | None = None,
        count: int = 100,
        timeout_s: float | None = None,
    ) -> list[BusEntry]:
        """``timeout_s`` bounds the call beyond ``block_ms`` (it is added to the block)."""
        if timeout_s is None:  # the realtime hot path: no timer, no wrapper
            raw = await self.redis.xread({stream: after}, count=count, block=block_ms)
        else:
            async with _bounded(timeout_s + (block_ms or 0) / 1000):
                raw = await self.redis.xread({stream: after}, count=count, block=block_ms)
        return _entries(raw[0][1]) if raw else []

    async def read_as(
        self, adapter: TypeAdapter[T], stream: str, after: str, *, block_ms: int | None = None
    ) -> list[BusMessage[T]]:
        """Up to 100 entries after ``after``, each parsed by ``adapter``: the realtime hot
        path (the caller bounds the call)."""
        raw = await self.redis.xread({stream: after}, count=100, block=block_ms)
        return _messages(raw[0][1], adapter) if raw else []

    async def exists(self, stream: str) -> bool:
        return bool(await self.redis.exists(stream))

    async def delete(self, *streams: str) -> None:
        if streams:
            await self.redis.delete(*streams)
