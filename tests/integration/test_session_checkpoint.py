"""World session checkpoints on a real Redis (issue 31 §5): a chunk and the checkpoint
taken after it enter Redis together or not at all; a takeover moves the fence on, so the
worker presumed dead adds nothing more; one takeover per chunk
(``storage/session_checkpoint.py``; the workers' leases: ``test_session_lease.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from models.session_bus import OUTPUTS, ChunkOutput, WorldCheckpoint
from storage.bus import EventBus
from storage.constants import session_checkpoint_key, session_out_key
from storage.session_checkpoint import CheckpointStore, claim_takeover
from tests.helpers import world_session_config
from tests.integration.conftest import REDIS_BASE_URL, flushed_redis

pytestmark = pytest.mark.integration

SESSION = "rtv_checkpoint"


@pytest.fixture
def url(redis_db: int) -> Iterator[str]:
    with flushed_redis(f"{REDIS_BASE_URL}/{redis_db}"):
        yield f"{REDIS_BASE_URL}/{redis_db}"


def _publish(store: CheckpointStore, attempt: int, index: int) -> str | None:
    chunk = ChunkOutput(kind="media", produced_at=1.0, generation_chunk_index=index, num_frames=33)
    meta = WorldCheckpoint(
        config=world_session_config(),
        chunks=index + 1,
        frames=33 * (index + 1),
        fragments=index + 1,
        commands_after=f"{index}-0",
    )
    state = f"state after {index}, attempt {attempt}".encode()
    return store.publish_chunk(SESSION, attempt, chunk, b"moof%d" % index, meta, b"ftypmoov", state)


def _media(client: redis.Redis) -> list[tuple[int | None, bytes | None]]:
    bus = EventBus(client, ttl_s=60)
    entries = bus.read_as(OUTPUTS, session_out_key(SESSION), "0-0")
    return [
        (e.event.generation_chunk_index, e.data)
        for e in entries
        if isinstance(e.event, ChunkOutput)
    ]


def _claim(url: str) -> tuple[int, WorldCheckpoint] | None:
    async def claim() -> tuple[int, WorldCheckpoint] | None:
        client = redis.asyncio.Redis.from_url(url)
        try:
            return await claim_takeover(client, SESSION, 60)
        finally:
            await client.aclose()

    return asyncio.run(claim())


def test_chunks_and_checkpoints_go_together_and_a_takeover_fences_the_old_worker(
    url: str,
) -> None:
    client = redis.Redis.from_url(url)
    store = CheckpointStore(EventBus(client, ttl_s=60), ttl_s=60)
    assert _claim(url) is None  # no chunk sent, nothing to take over from
    assert _publish(store, 1, 0) and _publish(store, 1, 1)
    with pytest.raises(redis.ResponseError, match="chunk 3 after 2 chunks"):
        _publish(store, 1, 3)  # a gap is a bug, refused loudly
    assert 0 < client.ttl(session_checkpoint_key(SESSION)) <= 60

    claimed = _claim(url)
    assert claimed is not None
    attempt, meta = claimed
    assert (attempt, meta.chunks, meta.commands_after) == (2, 2, "1-0")
    assert _claim(url) is None  # already taken over from chunk 2

    assert _publish(store, 1, 2) is None  # the old worker, back: refused, nothing added
    assert store.load(SESSION, 1) is None
    stored = store.load(SESSION, 2)
    assert stored is not None
    assert (stored.init, stored.state) == (b"ftypmoov", b"state after 1, attempt 1")
    assert _publish(store, 2, 2)  # the taker goes on
    assert _media(client) == [(0, b"moof0"), (1, b"moof1"), (2, b"moof2")]

    again = _claim(url)  # the taker died after one chunk: a takeover from chunk 3
    assert again is not None and again[0] == 3 and again[1].chunks == 3
    store.drop(SESSION, 2)  # a stale attempt deletes nothing
    assert store.load(SESSION, 3) is not None
    store.drop(SESSION, 3)
    assert not client.exists(session_checkpoint_key(SESSION))
    assert _claim(url) is None
