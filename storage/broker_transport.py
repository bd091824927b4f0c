"""kombu's Redis transport for the API's publishes, with one client per channel.

kombu's Redis channel builds a new ``redis.Redis`` object for every message it publishes
(``Channel.conn_or_acquire``); connections come from the channel's pool either way, but
building the client (its response-callback tables) was a sixth of the API's CPU per create.
A ``redis.Redis`` client is only a handle on its pool, so the channel keeps one and uses it
for every publish. When a channel is replaced (a broker error revives the producer on a new
channel), the new channel builds its own.

Used by the API's Celery publisher only (:func:`storage.queue.publisher_config`), for
``redis://`` broker URLs; workers keep kombu's transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from kombu.transport import redis as kombu_redis

PATH = "storage.broker_transport:PublisherTransport"


class PublisherChannel(kombu_redis.Channel):
    @cached_property
    def _shared_client(self) -> Any:
        return self._create_client()

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self._shared_client


class PublisherTransport(kombu_redis.Transport):
    Channel = PublisherChannel
