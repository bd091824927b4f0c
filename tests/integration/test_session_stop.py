"""A stop sent while a world session's step runs (``workers/sessions/turns.py``'s
:class:`SessionStop`, on real Redis): the watch sees it on the session's command stream,
without consuming what the session's own reader reads, and the next transformer block
of the running step raises."""

from __future__ import annotations

import time

import pytest
import redis

from models.session_bus import COMMANDS, InteractionCommand, KeepaliveCommand, StopCommand
from storage.bus import EventBus
from storage.constants import session_in_key
from tests.integration.conftest import RedisDbPool, flushed_redis
from workers.pipelines.base import step_stops
from workers.pipelines.blocks import BlockGate
from workers.sessions.turns import SessionStop, SessionStopped

pytestmark = pytest.mark.integration


def _wait(flag: SessionStop, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not flag.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)
    return flag.is_set()


def test_a_stop_on_the_command_stream_stops_the_running_step_at_its_next_block(
    redis_pool: RedisDbPool, redis_db: int
) -> None:
    with flushed_redis(redis_pool.url(redis_db)) as client:
        bus = EventBus(client, ttl_s=60)
        key = session_in_key("rtv_stopwatch")
        bus.publish(key, KeepaliveCommand())
        bus.publish(key, InteractionCommand(event_id="e1", prompt="snow"))
        watch = SessionStop(bus, key)
        try:
            time.sleep(0.2)
            assert not watch.is_set()  # other commands are not a stop
            gate = BlockGate("cpu")
            with step_stops(watch.reason):
                gate.enter(watch.reason)  # block 1 runs
                bus.publish(key, StopCommand(reason="client"))
                assert _wait(watch)
                with pytest.raises(SessionStopped, match="before block 2"):
                    gate.enter(watch.reason)
            with pytest.raises(SessionStopped, match="in the decode"):
                watch.check()  # the VAE's cancel points ask the same
            # the session's own reader still gets every command, the stop included
            read = bus.read_as(COMMANDS, key, "0-0")
            assert [type(e.event).__name__ for e in read] == [
                "KeepaliveCommand",
                "InteractionCommand",
                "StopCommand",
            ]
        finally:
            watch.close()


def test_the_watch_ends_with_its_session(redis_pool: RedisDbPool, redis_db: int) -> None:
    client = redis.Redis.from_url(redis_pool.url(redis_db))
    try:
        watch = SessionStop(EventBus(client, ttl_s=60), session_in_key("rtv_closed"))
        watch.close()
        watch._thread.join(timeout=5)
        assert not watch._thread.is_alive() and not watch.is_set()
    finally:
        client.close()
