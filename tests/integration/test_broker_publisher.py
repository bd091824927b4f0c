"""The API's Celery publisher on a real Redis: its transport keeps one client per channel
(kombu's builds one per message), messages land on the model's queue as Celery messages a
worker accepts, and a stopped Redis still fails the publish within the bounds."""

from __future__ import annotations

import json
import time

import pytest
import redis
from kombu.exceptions import OperationalError

from storage import broker_transport
from storage.constants import job_queue
from storage.queue import JobQueue, make_celery
from storage.settings import Settings


def test_publishes_reuse_one_client_and_land_on_the_queue(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(redis={"url": redis_url})  # type: ignore[arg-type]
    app = make_celery(settings, publisher=True)
    built = 0
    create = broker_transport.PublisherChannel._create_client

    def counting(self: broker_transport.PublisherChannel, asynchronous: bool = False) -> object:
        nonlocal built
        built += not asynchronous  # the publish clients (kombu's stock channel: one each)
        return create(self, asynchronous)

    monkeypatch.setattr(broker_transport.PublisherChannel, "_create_client", counting)
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
        assert built == 1
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
