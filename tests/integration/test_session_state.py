"""The Redis-held state of duplex realtime sessions (``storage/session_state.py``,
``api/realtime/voice_state.py``) against a real Redis: fenced writes, the bounded numbered
log, audio parts, TTLs, and a protocol taken over by "another replica"."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from api.realtime.voice_state import VoiceStateSync, take_over
from models.session_bus import COMMANDS, CancelCommand, RespondCommand, VoiceTurnSpec
from realtime.audio_protocol import VoiceSessionOptions
from realtime.session_snapshot import RelayPosition
from storage.constants import session_in_key, session_state_key
from storage.session_state import SessionStateStore
from tests.unit.realtime_client import Client, ScriptedVAD, run_response, speech

pytestmark = pytest.mark.integration

STREAM = {"stream_ttl_s": 300, "stream_maxlen": 2000}  # the session's in stream


def _run(redis_url: str, body: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            await body(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_commands_go_to_the_worker_with_the_save_or_not_at_all(redis_url: str) -> None:
    """The worker's commands are written in the save's script: a replica whose save is
    refused (taken over) sends none, and a stored state never counts a command the worker
    did not get."""

    async def body(r: Any) -> None:
        store = SessionStateStore(r, ttl_s=60, log_events=10, **STREAM)
        sid = "sess_commands"
        inbox = session_in_key(sid)
        await store.create(sid, "A")
        respond = RespondCommand(response_id="resp_1", turn=VoiceTurnSpec(text="hi"))
        cancel = CancelCommand(response_id="resp_1", reason="client_cancelled")
        assert await store.save(
            sid, "A", frames=[(1, "f1")], state='{"v":1}', commands=[(respond, b"pcm")]
        )
        entries = await r.xrange(inbox)
        assert len(entries) == 1 and 0 < await r.ttl(inbox) <= 300
        fields = entries[0][1]
        assert COMMANDS.validate_json(fields[b"event"]) == respond and fields[b"data"] == b"pcm"
        assert await r.ttl(session_state_key(sid, "state")) > 0  # not the stream's TTL
        await store.take_over(sid, "B", after_seq=1)
        assert not await store.save(sid, "A", state='{"v":2}', commands=[(cancel, None)])
        assert len(await r.xrange(inbox)) == 1  # the refused save sent nothing
        assert await store.save(sid, "B", commands=[(cancel, None)])
        last = (await r.xrange(inbox))[-1][1]
        assert COMMANDS.validate_json(last[b"event"]) == cancel and b"data" not in last
        assert await store.drop(sid, "B")
        assert await r.exists(inbox) and not await r.exists(session_state_key(sid, "state"))
        await r.delete(inbox)

    _run(redis_url, body)


def test_writes_are_fenced_by_the_holder_and_the_log_is_bounded(redis_url: str) -> None:
    async def body(r: Any) -> None:
        store = SessionStateStore(r, ttl_s=60, log_events=5, **STREAM)
        sid = "sess_fence"
        await store.create(sid, "A")
        frames = [(seq, json.dumps({"seq": seq})) for seq in range(1, 9)]
        assert await store.save(sid, "A", frames=frames, state='{"v":1}')
        log = session_state_key(sid, "log")
        assert await r.xlen(log) == 5  # the last log_events only
        taken = await store.take_over(sid, "B", after_seq=5)
        assert taken is not None and taken.state == b'{"v":1}'
        assert taken.log == frames[5:]
        # A was taken over: none of its writes land any more
        assert not await store.save(sid, "A", frames=[(9, "late")], state='{"v":2}')
        assert not await store.touch(sid, "A")
        assert not await store.drop(sid, "A")
        assert await store.load(sid) == b'{"v":1}' and await r.xlen(log) == 5
        assert await store.holds(sid, "B") and not await store.holds(sid, "A")
        assert await store.save(sid, "B", frames=[(9, "next")], state='{"v":3}')
        assert (await store.take_over(sid, "C", after_seq=8)).log == [(9, "next")]  # type: ignore[union-attr]
        assert await store.take_over("sess_unknown", "C", after_seq=0) is None

    _run(redis_url, body)


def test_audio_parts_and_every_key_expire_with_the_session(redis_url: str) -> None:
    async def body(r: Any) -> None:
        store = SessionStateStore(r, ttl_s=30, log_events=100, **STREAM)
        sid = "sess_audio"
        part, other = ("item_1", 0), ("item_2", 0)
        await store.create(sid, "A")
        assert await store.save(
            sid,
            "A",
            state="{}",
            writes=[("set", part, b"ab"), ("set", other, b"x")],
            parts=[part, other],
        )
        assert await store.save(sid, "A", writes=[("append", part, b"cd")], parts=[part, other])
        assert await store.audio(sid, [part, other]) == {part: b"abcd", other: b"x"}
        assert await store.save(sid, "A", writes=[("delete", other, b"")], parts=[part])
        assert await store.audio(sid, [part, other]) == {part: b"abcd"}
        keys = [session_state_key(sid, k) for k in ("holder", "state", "audio:item_1:0")]
        assert [0 < await r.ttl(k) <= 30 for k in keys] == [True, True, True]
        await r.expire(keys[2], 5)
        assert await store.touch(sid, "A", [part])  # the TTL of every part is refreshed
        assert await r.ttl(keys[2]) > 5
        assert await store.drop(sid, "A", [part])
        assert [await r.exists(k) for k in keys] == [0, 0, 0]

    _run(redis_url, body)


def test_a_protocol_saved_on_one_replica_is_taken_over_on_another(redis_url: str) -> None:
    async def body(r: Any) -> None:
        store = SessionStateStore(r, ttl_s=60, log_events=1000, **STREAM)
        c = Client(duplex=True, turn_detection=None)
        a = VoiceStateSync(store, c.p.id, "owner-1")
        relay = RelayPosition(placed=True, worker_admitted=True, out_cursor="17-0")
        assert await a.save(c.p, relay, commands=[], now=c.now, wall=1e9)
        rid = run_response(c, deltas=3)
        assert await a.save(c.p, relay, commands=[], now=c.now, wall=1e9)
        # nothing new: no write at all
        assert await a.save(c.p, relay, commands=[], now=c.now, wall=1e9)
        token = c.p.resume_token or ""
        seen = c.events[-4]["server_event_seq"]

        def options() -> VoiceSessionOptions:
            return VoiceSessionOptions(model="ignored", duplex=True)

        async def takeover(tok: str, owner: str) -> Any:
            return await take_over(
                store, c.p.id, tok, owner, seen, options(), ScriptedVAD, 5.0, 1e9 + 1
            )

        assert await takeover("wrong", "owner-1") is None
        assert await takeover(token, "someone-else") is None
        assert await store.holds(c.p.id, a.holder)  # refusals take nothing
        taken = await takeover(token, "owner-1")
        assert taken is not None and taken.model == "reference/voice"
        assert taken.relay == relay
        b = taken.protocol
        assert b.resume(token, seen)
        replayed = [json.loads(f) for f in b.data_to_send()[1:]]
        assert replayed == c.events[-3:]
        assert b.conversation.get(c.p.conversation.ids()[-1]).audio == {0: bytearray(speech(120))}  # type: ignore[union-attr]
        # the old replica learns it lost the session at its next write
        c.p.worker_audio(rid, speech(40), None, 1.0)
        assert not await a.save(c.p, relay, commands=[], now=c.now, wall=1e9)
        b.worker_audio(rid, speech(40), None, 1.0)
        assert await taken.sync.save(b, relay, commands=[], now=6.0, wall=1e9 + 2)
        stored = await store.audio(c.p.id, [(c.p.conversation.ids()[-1], 0)])
        assert list(stored.values()) == [speech(160)]
        await taken.sync.drop(b)
        assert await store.load(c.p.id) is None

    _run(redis_url, body)
