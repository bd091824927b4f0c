"""kombu's Redis transport, adjusted: one client per channel for the API's publishes, and
an ack that frees its prefetch slot even when Redis failed, for workers.

kombu's Redis channel builds a new ``redis.Redis`` object for every message it publishes
(``Channel.conn_or_acquire``); connections come from the channel's pool either way, but
building the client (its response-callback tables) was a sixth of the API's CPU per create.
A ``redis.Redis`` client is only a handle on its pool, so the channel keeps one and uses it
for every publish. When a channel is replaced (a broker error revives the producer on a new
channel), the new channel builds its own.

Used by the API's Celery publisher (:func:`storage.queue.publisher_config`), for
``redis://`` broker URLs.

**Workers** (:data:`WORKER_PATH`): kombu's Redis ``QoS.ack`` frees the message's prefetch
slot only after its Redis command succeeded. When the ack fails (the broker link died
while the job ran), the slot stays taken, and with a prefetch of 1 the worker never
consumes again: after a partition a healed worker stayed deaf. :class:`WorkerQoS` frees
the slot whatever Redis answered; the message stays in kombu's unacked index, so it is
delivered again later (at least once), and the job claim drops it (the job has ended).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

PATH = "storage.broker_transport:PublisherTransport"
WORKER_PATH = "storage.broker_transport:WorkerTransport"


class PublisherChannel(kombu_redis.Channel):
    @cached_property
    def _shared_client(self) -> Any:
        return self._create_client()

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self._shared_client


class PublisherTransport(kombu_redis.Transport):
    Channel = PublisherChannel


class WorkerQoS(kombu_redis.QoS):
    def ack(self, delivery_tag: Any) -> None:
        try:
            self._remove_from_indices(delivery_tag).execute()
        finally:
            virtual.QoS.ack(self, delivery_tag)  # the prefetch slot, whatever Redis said


class WorkerChannel(kombu_redis.Channel):
    QoS = WorkerQoS


class WorkerTransport(kombu_redis.Transport):
    Channel = WorkerChannel
