"""Redis-held state of duplex realtime sessions, so that any API replica can serve one and
take it over when the replica that served it died (``session.resume``).

Per session (keys in :func:`storage.constants.session_state_key`):

    holder                  the replica serving it now (an opaque token per attachment)
    state                   the protocol snapshot (JSON, ``models/realtime_state.py``)
    log                     Stream of the client-facing events, entry id ``{seq}-0``, field
                            ``f`` = the JSON frame; the last ``log_events`` are kept
    audio:{item}:{index}    PCM16 of one content part of the conversation

Every write is one Lua script that first checks ``holder`` (fencing): a replica whose
session was taken over writes nothing more, learns it from the answer (``False``) and
lets the session go. A save writes the new log entries, the audio changes, the snapshot
and the worker's new commands (onto the session's ``in`` stream) together, so the log
never holds an event the snapshot does not account for, the snapshot never counts a
command the worker will not get, and a replica that lost the session cannot command the
worker; the caller sends events to the client only after they were saved: whatever a
client saw, another replica can replay. Every key expires ``ttl_s`` after the last save or
:meth:`SessionStateStore.touch`.

Calls are not bounded here; the realtime shell bounds each one (``api/realtime/broker.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from storage.bus import entry_fields
from storage.constants import session_in_key, session_state_key

# (item id, content index) of one audio part
Part = tuple[str, int]

# KEYS: holder, state, log, audio parts…, [the session's in stream, last]
# ARGV: holder, ttl, maxlen, state JSON ('' = keep), frame count, (seq, frame)…,
# write count, (op, KEYS index, data)…, 'drop' flag, command count,
# (field count, fields…)…, in stream maxlen, in stream ttl
_SAVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[5])
local i = 6
for _ = 1, n do
  redis.call('XADD', KEYS[3], 'MAXLEN', ARGV[3], ARGV[i] .. '-0', 'f', ARGV[i + 1])
  i = i + 2
end
local m = tonumber(ARGV[i])
i = i + 1
for _ = 1, m do
  local op, key, data = ARGV[i], KEYS[tonumber(ARGV[i + 1])], ARGV[i + 2]
  if op == 'append' then redis.call('APPEND', key, data)
  elseif op == 'set' then redis.call('SET', key, data)
  else redis.call('DEL', key) end
  i = i + 3
end
local drop = ARGV[i] == 'drop'
local c = tonumber(ARGV[i + 1])
i = i + 2
local last = #KEYS
if c > 0 then
  last = #KEYS - 1
  local inbox = KEYS[#KEYS]
  local maxlen, inbox_ttl = ARGV[#ARGV - 1], ARGV[#ARGV]
  for _ = 1, c do
    local k = tonumber(ARGV[i])
    redis.call('XADD', inbox, 'MAXLEN', '~', maxlen, '*', unpack(ARGV, i + 1, i + k))
    i = i + 1 + k
  end
  redis.call('EXPIRE', inbox, inbox_ttl)
end
if drop then
  redis.call('DEL', unpack(KEYS, 1, last))
  return 1
end
if ARGV[4] ~= '' then redis.call('SET', KEYS[2], ARGV[4]) end
for j = 1, last do redis.call('EXPIRE', KEYS[j], ttl) end
return 1
"""


@dataclass(frozen=True)
class TakenOver:
    """What a replica reads when it takes a session over."""

    state: bytes
    log: list[tuple[int, str]]  # the logged frames after the client's last seq, in order


class SessionStateStore:
    """asyncio store (the API) of the Redis-held state of duplex realtime sessions."""

    def __init__(
        self,
        redis: Any,
        *,
        ttl_s: int,
        log_events: int,
        stream_ttl_s: int,
        stream_maxlen: int,
    ) -> None:
        """``stream_ttl_s`` / ``stream_maxlen``: those of the session's ``in`` stream, as
        the event bus keeps its streams (``storage/bus.py``)."""
        self.redis = redis
        self.ttl_s = ttl_s
        self.log_events = log_events
        self.stream_ttl_s = stream_ttl_s
        self.stream_maxlen = stream_maxlen
        self._save = redis.register_script(_SAVE)

    @staticmethod
    def _keys(session_id: str, parts: Sequence[Part]) -> list[str]:
        base = [session_state_key(session_id, k) for k in ("holder", "state", "log")]
        return base + [session_state_key(session_id, f"audio:{i}:{n}") for i, n in parts]

    async def create(self, session_id: str, holder: str) -> None:
        """A new session, served by ``holder``."""
        await self.redis.set(session_state_key(session_id, "holder"), holder, ex=self.ttl_s)

    async def save(
        self,
        session_id: str,
        holder: str,
        *,
        frames: Sequence[tuple[int, str]] = (),
        state: str = "",
        writes: Sequence[tuple[str, Part, bytes]] = (),
        parts: Sequence[Part] = (),
        drop: bool = False,
        commands: Sequence[tuple[BaseModel, bytes | None]] = (),
    ) -> bool:
        """Append ``frames`` to the log, apply the audio ``writes`` (``append`` / ``set``
        / ``delete`` of a part), store ``state``, put ``commands`` (session bus commands
        and their bytes) on the session's ``in`` stream for its worker, refresh every
        key's TTL (``parts``: the audio parts the session holds now), or with ``drop``
        delete it all. False when ``holder`` no longer serves the session: nothing was
        written, no command sent."""
        order = list(dict.fromkeys([*parts, *(w[1] for w in writes)]))
        index = {part: i + 4 for i, part in enumerate(order)}  # Lua KEYS are 1-based
        keys = self._keys(session_id, order)
        args: list[Any] = [holder, self.ttl_s, self.log_events, state, len(frames)]
        for seq, frame in frames:
            args += [seq, frame]
        args.append(len(writes))
        for op, part, data in writes:
            args += [op, index[part], data]
        args += ["drop" if drop else "", len(commands)]
        for command, payload in commands:
            fields = [x for pair in entry_fields(command, payload).items() for x in pair]
            args += [len(fields), *fields]
        if commands:
            keys.append(session_in_key(session_id))
            args += [self.stream_maxlen, self.stream_ttl_s]
        done = await self._save(keys=keys, args=args)
        return bool(done)

    async def touch(self, session_id: str, holder: str, parts: Sequence[Part] = ()) -> bool:
        """Keep the session's state alive another ``ttl_s``; False when it is not ours."""
        return await self.save(session_id, holder, parts=parts)

    async def drop(self, session_id: str, holder: str, parts: Sequence[Part] = ()) -> bool:
        """The session ended: delete its state (if still ours)."""
        return await self.save(session_id, holder, parts=parts, drop=True)

    async def holds(self, session_id: str, holder: str) -> bool:
        """Whether ``holder`` serves the session now."""
        now: bytes | None = await self.redis.get(session_state_key(session_id, "holder"))
        return now is not None and now.decode() == holder

    async def load(self, session_id: str) -> bytes | None:
        """The stored snapshot (JSON), or None."""
        state: bytes | None = await self.redis.get(session_state_key(session_id, "state"))
        return state

    async def take_over(self, session_id: str, holder: str, after_seq: int) -> TakenOver | None:
        """Make ``holder`` the session's replica (from now on, the previous one's writes
        are refused) and read its snapshot and the logged frames after ``after_seq``, all
        in one transaction; None when there is no stored session."""
        keys = self._keys(session_id, ())
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(keys[0], holder, ex=self.ttl_s, xx=True)
            pipe.get(keys[1])
            pipe.xrange(keys[2], min=f"{max(after_seq, 0) + 1}-0")
            swapped, state, entries = await pipe.execute()
        if not swapped or state is None:
            return None
        log = [(int(eid.split(b"-")[0]), fields[b"f"].decode()) for eid, fields in entries]
        return TakenOver(state, log)

    async def audio(self, session_id: str, parts: Sequence[Part]) -> dict[Part, bytes]:
        """The stored PCM16 of ``parts`` (missing ones: absent)."""
        if not parts:
            return {}
        values = await self.redis.mget(self._keys(session_id, parts)[3:])
        return {p: v for p, v in zip(parts, values, strict=True) if v is not None}
