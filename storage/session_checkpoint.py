"""World session checkpoints in Redis: what lets another worker take a session over when
its own dies (issue 31 §5; the worker's half is ``workers/sessions/world_checkpoint.py``, the API's
``api/realtime/relay.py``).

One hash per session (``storage.constants.session_checkpoint_key``), with a TTL::

    attempt    the placement allowed to write (the fence): 1, then one more per takeover
    chunks     media chunks in the session's ``out`` stream
    claimed    ``chunks`` when the session was last taken over (one takeover per chunk)
    meta       models.session_bus.WorldCheckpoint as JSON (config, fMP4 position, cursor)
    init       the fMP4 init segment the client has
    state      the pipeline's snapshot (compressed bytes)

Invariants, each kept by one script:

* :data:`PUBLISH_CHUNK`: a media chunk enters the ``out`` stream together with the
  checkpoint taken right after it, or neither does. So the checkpoint always says exactly
  which chunks the client can have (no chunk made twice reaches it, none is skipped),
  and a worker whose fence moved on (presumed dead, taken over, back again) adds nothing.
* :data:`CLAIM`: a takeover moves the fence on and is refused when the session was
  already taken over from this same chunk: a session that kills every worker before its
  next chunk ends instead of going round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from models.session_bus import WorldCheckpoint
from storage.bus import EventBus, entry_fields
from storage.constants import session_checkpoint_key, session_out_key

# KEYS: checkpoint, out stream. ARGV: attempt, index, checkpoint ttl, stream maxlen,
# stream ttl, meta, init, state, then the stream entry's field/value pairs.
# Returns the entry id; nil when the fence moved on (another attempt holds the session).
PUBLISH_CHUNK = """
local fence = redis.call('HGET', KEYS[1], 'attempt')
if fence then
  if tonumber(fence) ~= tonumber(ARGV[1]) then return false end
  local chunks = tonumber(redis.call('HGET', KEYS[1], 'chunks'))
  if chunks ~= tonumber(ARGV[2]) then
    return redis.error_reply('chunk ' .. ARGV[2] .. ' after ' .. chunks .. ' chunks')
  end
end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', unpack(ARGV, 9))
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('HSET', KEYS[1], 'attempt', ARGV[1], 'chunks', ARGV[2] + 1,
           'meta', ARGV[6], 'init', ARGV[7], 'state', ARGV[8])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return id
"""

# KEYS: checkpoint. ARGV: ttl. Returns {attempt, meta} of the new placement, or nil: no
# checkpoint, or the session was already taken over from the chunk it holds.
CLAIM = """
local chunks = redis.call('HGET', KEYS[1], 'chunks')
if not chunks or redis.call('HGET', KEYS[1], 'claimed') == chunks then return false end
redis.call('HSET', KEYS[1], 'claimed', chunks)
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('EXPIRE', KEYS[1], ARGV[1])
return {attempt, redis.call('HGET', KEYS[1], 'meta')}
"""

# KEYS: checkpoint. ARGV: attempt. Deletes it while that attempt holds the session.
DROP = """
if redis.call('HGET', KEYS[1], 'attempt') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class StoredCheckpoint:
    meta: WorldCheckpoint
    init: bytes
    state: bytes


class CheckpointStore:
    """The worker's side (synchronous), on its event bus's Redis client."""

    def __init__(self, bus: EventBus, ttl_s: int) -> None:
        self.bus = bus
        self.ttl_s = ttl_s
        self._publish = bus.redis.register_script(PUBLISH_CHUNK)
        self._drop = bus.redis.register_script(DROP)

    def publish_chunk(
        self,
        session_id: str,
        attempt: int,
        chunk: BaseModel,
        data: bytes,
        meta: WorldCheckpoint,
        init: bytes,
        state: bytes,
    ) -> str | None:
        """Add ``chunk`` (media chunk ``meta.chunks - 1``, its fMP4 bytes ``data``) to
        the session's ``out`` stream and store ``meta``, ``init`` and ``state``, at once;
        None (nothing written) when another attempt holds the session."""
        fields = [part for pair in entry_fields(chunk, data).items() for part in pair]
        args = [
            attempt,
            meta.chunks - 1,
            self.ttl_s,
            self.bus.maxlen,
            self.bus.ttl_s,
            meta.model_dump_json(),
            init,
            state,
            *fields,
        ]
        keys = [session_checkpoint_key(session_id), session_out_key(session_id)]
        entry_id = self._publish(keys=keys, args=args)
        return None if entry_id is None else _text(entry_id)

    def load(self, session_id: str, attempt: int) -> StoredCheckpoint | None:
        """The checkpoint ``attempt`` was placed to take over; None when it expired or a
        later attempt holds the session."""
        raw = self.bus.redis.hmget(
            session_checkpoint_key(session_id), ["attempt", "meta", "init", "state"]
        )
        fence, meta, init, state = raw
        if fence is None or int(fence) != attempt or meta is None:
            return None
        return StoredCheckpoint(WorldCheckpoint.model_validate_json(meta), init, state)

    def drop(self, session_id: str, attempt: int) -> None:
        """The session ended on ``attempt``'s worker: nothing is left to take over."""
        self._drop(keys=[session_checkpoint_key(session_id)], args=[attempt])


async def claim_takeover(
    redis: Any, session_id: str, ttl_s: int
) -> tuple[int, WorldCheckpoint] | None:
    """The API's side: take the session over from its checkpoint (the fence moves on, so
    the worker presumed dead writes nothing more); the new placement's attempt and the
    checkpoint, or None when there is none to take it over from (no checkpoint: the model
    takes no snapshots, or no chunk was sent; or the session was already taken over
    from that chunk)."""
    claimed = await redis.eval(CLAIM, 1, session_checkpoint_key(session_id), ttl_s)
    if claimed is None:
        return None
    attempt, meta = claimed
    return int(attempt), WorldCheckpoint.model_validate_json(meta)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
