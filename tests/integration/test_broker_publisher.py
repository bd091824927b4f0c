"""The API's Celery publisher on a real Redis: its transport keeps one client per channel
(kombu's builds one per message), messages land on the model's queue as Celery messages a
worker accepts, and a stopped Redis still fails the publish within the bounds."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from kombu.exceptions import OperationalError
from kombu.utils.imports import symbol_by_name

from storage import broker_transport
from storage.constants import job_queue
from storage.queue import JobQueue, make_celery
from storage.settings import Settings


def test_publishes_reuse_one_client_and_land_on_the_queue(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(redis={"url": redis_url})  # type: ignore[arg-type]
    app = make_celery(settings, publisher=True)
    # the channel class kombu resolves from the configured transport path
    channel = symbol_by_name(broker_transport.PATH).Channel
    acquire = channel.conn_or_acquire
    used: list[Any] = []  # the client of each publish (kombu's stock channel: one each)

    @contextmanager
    def recording(self: Any, client: Any = None) -> Iterator[Any]:
        with acquire(self, client) as got:
            used.append(got)  # held, so no id is reused
            yield got

    monkeypatch.setattr(channel, "conn_or_acquire", recording)
    client = redis.Redis.from_url(redis_url)
    queue = job_queue("reference/bench")
    client.delete(queue)
    try:
        jobs = JobQueue(app)
        for i in range(20):
            jobs.enqueue(f"video_pub{i}", "reference/bench")
        assert client.llen(queue) == 20
        message = json.loads(client.rpop(queue))  # type: ignore[arg-type]
        assert message["headers"]["task"] == "omniqueue.run_job"
        assert message["headers"]["id"] == "video_pub0"
        # one producer (one channel) served the 20 sequential publishes: one client
        assert len(used) >= 20 and len({id(c) for c in used}) == 1, used
        assert type(app.connection_for_write().default_channel).__name__ == "PublisherChannel"
    finally:
        client.delete(queue)
        client.close()
        app.close()


def test_a_dead_broker_fails_the_publish_quickly() -> None:
    settings = Settings(  # type: ignore[arg-type]
        redis={"url": "redis://127.0.0.1:1/0", "command_timeout_s": 0.5, "connect_timeout_s": 0.5}
    )
    app = make_celery(settings, publisher=True)
    t0 = time.monotonic()
    with pytest.raises(OperationalError):
        JobQueue(app).enqueue("video_nobroker", "reference/bench")
    assert time.monotonic() - t0 < 10
    app.close()
