"""A duplex voice session whose replica loses Redis sends the client nothing it could not
store: the socket closes with 1012 (``broker_error``) and the stored session is left as
it stands for the replica the client resumes on (``VoiceSession._let_go``). The store and
the socket are fakes; the real partition is ``tests/cluster/test_faults.py``'s fault 4."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from api.realtime.voice_session import CLOSE_RESUME_ELSEWHERE, VoiceSession
from storage.settings import Settings


class Store:
    """A :class:`storage.session_state.SessionStateStore` that works until ``lost``."""

    ttl_s = 120

    def __init__(self) -> None:
        self.lost = False
        self.saved: list[int] = []  # the seqs stored
        self.dropped = False

    async def create(self, session_id: str, holder: str) -> None:
        self._check()

    async def save(self, session_id: str, holder: str, **kw: Any) -> bool:
        self._check()
        self.saved += [seq for seq, _ in kw.get("frames", ())]
        return True

    async def drop(self, *args: Any) -> bool:
        self._check()
        self.dropped = True
        return True

    async def touch(self, *args: Any) -> bool:
        self._check()
        return True

    def _check(self) -> None:
        if self.lost:
            raise RedisConnectionError("the link to Redis is down")


class Socket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


class Host:
    def __init__(self) -> None:
        self.settings = Settings()
        self.session_states = Store()
        self.voice_sessions: dict[str, Any] = {}
        self.abus = self.queue = None
        self.detached_world_sessions: dict[str, Any] = {}
        self.availability = None  # never asked: these sessions are placed already


def _session() -> tuple[VoiceSession, Host, Socket]:
    host, ws = Host(), Socket()
    session = VoiceSession(host, "owner", "reference/voice", duplex=True)
    session.relay.placed = True  # as if on a worker: nothing to place in these tests
    session.attach(ws)  # type: ignore[arg-type]
    host.voice_sessions[session.id] = session
    return session, host, ws


def test_frames_are_sent_only_once_stored_and_a_lost_store_closes_1012() -> None:
    async def go() -> None:
        session, host, ws = _session()
        await session.flush()  # session.created: stored, then sent
        assert [e["type"] for e in ws.sent] == ["session.created"]
        assert host.session_states.saved == [1]
        host.session_states.lost = True
        item = {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "hello"}]}  # fmt: skip
        await session.receive(json.dumps({"type": "conversation.item.create", "item": item}))
        # conversation.item.added/done were produced but could not be stored: not sent
        assert [e["type"] for e in ws.sent] == ["session.created"]
        assert ws.closed == (CLOSE_RESUME_ELSEWHERE, "broker_error")
        assert session.let_go and session.ended_event.is_set()
        assert host.voice_sessions == {}  # this replica holds it no more…
        host.session_states.lost = False
        await session.finish()
        assert not host.session_states.dropped  # …and leaves its stored state alone

    asyncio.run(go())


def test_a_lost_relay_lets_a_duplex_session_go_without_an_error_event() -> None:
    async def go() -> None:
        session, host, ws = _session()
        await session.flush()
        host.session_states.lost = True
        await session.broker_lost()  # the relay's read failed
        assert [e["type"] for e in ws.sent] == ["session.created"]  # no broker_error event
        assert ws.closed == (CLOSE_RESUME_ELSEWHERE, "broker_error")
        await session.flush()  # later flushes send nothing
        await session.disconnected()
        assert session.grace is None and [e["type"] for e in ws.sent] == ["session.created"]

    asyncio.run(go())


def test_a_non_duplex_session_still_ends_with_broker_error() -> None:
    async def go() -> None:
        host, ws = Host(), Socket()
        session = VoiceSession(host, "owner", "reference/voice", duplex=False)
        session.relay.placed = True
        session.attach(ws)  # type: ignore[arg-type]
        await session.flush()
        await session.broker_lost()
        error = ws.sent[-1]
        assert error["type"] == "error" and error["error"]["code"] == "broker_error"
        assert ws.closed is not None and ws.closed[0] == 1011
        await session.finish()

    asyncio.run(go())
