"""Fair share across keys (``storage/fair_share.py``): the claim statement on SQLite and
PostgreSQL, and on the real stack one key's flood does not hold back another key's job.

Order is asserted from the job rows' ``started_at``, never from timings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select

from cli.embedded import EmbeddedS3
from models.db import Job, JobStatus
from storage.db import make_sessionmaker
from storage.jobs import JobStore, Lease
from tests.helpers import video_spec
from tests.integration.conftest import started_stack
from tests.integration.stack import Stack

pytestmark = pytest.mark.integration

TINY = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 1}
FLOOD = 30


@pytest.fixture
def store(engine: Engine) -> JobStore:
    return JobStore(make_sessionmaker(engine), fair_share=True)


def _queue(store: JobStore, **per_key: int) -> None:
    """Queue jobs of model ``m/a``: ``key_a=3`` queues ``video_a0`` … ``video_a2`` for
    ``key_a``, one second apart, each key after the previous one's."""
    t = time.time() - 100
    for key, count in per_key.items():
        for i in range(count):
            job_id = f"video_{key.removeprefix('key_')}{i}"
            job = Job.new(video_spec(model="m/a"), id=job_id, owner=key, created_at=t)
            store.create(job, idempotency_window_s=60)
            t += 1


def _finish(store: JobStore, job: Job | None) -> str:
    assert job is not None and job.status == JobStatus.IN_PROGRESS
    assert store.complete(job.id, Lease("w1", job.attempt), [])
    return job.id


def test_claims_take_turns_across_keys_fifo_within_a_key(store: JobStore) -> None:
    _queue(store, key_a=4, key_b=2)
    other = Job.new(video_spec(model="m/other"), id="video_c0", owner="key_c")
    store.create(other, idempotency_window_s=60)  # another model's queue
    # one worker: each claim after the previous job ended
    order = [_finish(store, store.claim_next("m/a", "w1")) for _ in range(6)]
    # keys never served go first (by their oldest job), then turns by the oldest last start
    assert order == ["video_a0", "video_b0", "video_a1", "video_b1", "video_a2", "video_a3"]
    assert store.claim_next("m/a", "w1") is None  # nothing of m/a is queued
    assert store.get("video_c0").status == JobStatus.QUEUED  # type: ignore[union-attr]


def test_a_key_with_running_jobs_yields_and_cancelled_jobs_are_skipped(store: JobStore) -> None:
    _queue(store, key_a=3, key_b=2)
    first = store.claim_next("m/a", "w1")
    assert first is not None and first.id == "video_a0" and first.worker_id == "w1"
    assert first.attempt == 1 and first.started_at is not None
    # two workers: key_a has one running, so the second worker serves key_b
    second = store.claim_next("m/a", "w2")
    assert second is not None and second.id == "video_b0"
    assert store.cancel("video_a1")  # a cancelled queued job is never claimed
    third = store.claim_next("m/a", "w3")
    assert third is not None and third.id == "video_a2"  # both keys run one; a's is older
    # positions as round-robin takes them: b1 is key_b's next, nothing of a is queued
    assert store.queue_positions([store.read("video_b1")]) == {"video_b1": 0}  # type: ignore[list-item]


def test_queue_positions_count_round_robin_turns(store: JobStore) -> None:
    _queue(store, key_a=3, key_b=1)
    rows = [store.read(j) for j in ("video_a0", "video_a1", "video_a2", "video_b0")]
    positions = store.queue_positions(rows)  # type: ignore[arg-type]
    # b0 is key_b's first turn: nothing takes a turn before it, whatever key_a queued
    assert positions == {"video_a0": 0, "video_a1": 2, "video_a2": 3, "video_b0": 0}
    assert store.queue_positions([rows[2]]) == {"video_a2": 3}  # type: ignore[list-item]


# ---- the real stack --------------------------------------------------------------------


@pytest.fixture(scope="module")
def fair_stack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, redis_db: int
) -> Iterator[Stack]:
    """API + one job worker, keys required (two tenants)."""
    with started_stack(
        tmp_path_factory, s3_server, "fair", redis_db=redis_db, auth="required"
    ) as st:
        yield st


def _rows(st: Stack, ids: list[str]) -> dict[str, Any]:
    engine = create_engine(st.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(Job.id, Job.status, Job.created_at, Job.started_at, Job.attempt).where(
                    Job.id.in_(ids)
                )
            ).all()
    finally:
        engine.dispose()
    return {row.id: row for row in rows}


def test_a_small_key_is_not_held_behind_a_flood(fair_stack: Stack) -> None:
    flood_key, small_key = fair_stack.create_key("flood"), fair_stack.create_key("small")
    with fair_stack.client(flood_key) as flood, fair_stack.client(small_key) as small:
        flooded = []
        for _ in range(FLOOD):
            resp = flood.post("/v1/videos", json={"prompt": "flood", **TINY})
            assert resp.status_code == 200, resp.text
            flooded.append(resp.json()["id"])
        resp = small.post("/v1/videos", json={"prompt": "small", **TINY})
        assert resp.status_code == 200, resp.text
        mine = resp.json()
        assert mine["queue_position"] <= 1  # its key's first turn, not behind the flood
        done = fair_stack.wait_for(small, mine["id"], timeout=120)
        assert done["status"] == "completed", done
        # every job still runs, once: messages and jobs stay one to one
        for job_id in flooded:
            assert fair_stack.wait_for(flood, job_id, timeout=180)["status"] == "completed"
    rows = _rows(fair_stack, [*flooded, mine["id"]])
    me = rows[mine["id"]]
    # the first claim after the small job was stored took it: no flood job started
    # between its create and its start but the one claim that may have raced its INSERT
    overtook = [j for j in flooded if me.created_at <= rows[j].started_at < me.started_at]
    assert len(overtook) <= 1, overtook
    after = [j for j in flooded if rows[j].started_at > me.started_at]
    assert len(after) >= FLOOD // 2, "the small job waited for most of the flood"
    assert all(row.attempt == 1 for row in rows.values())
