"""The webhook outbox (storage/outbox.py) on SQLite and PostgreSQL: a job's end queues
its deliveries once, claims never overlap and lapse with their lease, attempts are kept,
and the sweep queues what a crash between a job's end and its insert left out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from models.db import Job, WebhookDelivery
from models.webhooks import JobWebhook
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore, Lease
from storage.outbox import Attempt, WebhookOutbox, event_id
from storage.settings import DatabaseSettings
from storage.webhooks import WebhookStore
from tests.helpers import video_spec
from tests.integration.conftest import new_database

pytestmark = pytest.mark.integration

HOOK = "https://hooks.example.com/a"


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with new_database(request.param, tmp_path) as url:
        engine = make_engine(DatabaseSettings(url=url))
        try:
            yield make_sessionmaker(engine)
        finally:
            engine.dispose()


def _job(jobs: JobStore, job_id: str, owner: str = "local", **hook: object) -> str:
    spec = video_spec(webhook=JobWebhook(**hook)) if hook else video_spec()
    jobs.create(Job.new(spec, id=job_id, owner=owner), idempotency_window_s=60)
    assert jobs.claim(job_id, "w")
    return job_id


def _complete(jobs: JobStore, job_id: str) -> None:
    assert jobs.complete(job_id, Lease("w", 1), [], progress=100, stage="done", completed_at=1000.0)


def test_a_job_end_queues_its_deliveries_once(sessions: sessionmaker[Session]) -> None:
    jobs, hooks = JobStore(sessions), WebhookStore(sessions)
    hooks.add_endpoint("local", "https://hooks.example.com/key")
    hooks.add_endpoint("local", HOOK)  # the job's own URL again: one delivery
    hooks.add_endpoint("local", "https://hooks.example.com/cancels", ["video.cancelled"])
    hooks.add_endpoint("someone-else", "https://hooks.example.com/other")
    job = _job(jobs, "video_a", url=HOOK)
    assert jobs.outbox.enqueue(job) == 0  # still running: nothing to say
    _complete(jobs, job)  # JobStore queues them after the UPDATE
    rows = jobs.outbox.deliveries(job)
    assert [r["url"] for r in rows] == [HOOK, "https://hooks.example.com/key"]
    assert {r["event_id"] for r in rows} == {event_id(job)}
    assert rows[0]["payload"] == (
        f'{{"object":"event","id":"{event_id(job)}","type":"video.completed",'
        f'"created_at":1000,"data":{{"id":"{job}"}}}}'
    )
    assert jobs.outbox.enqueue(job) == 0  # again: nothing new
    assert jobs.outbox.sweep(since=0) == 0

    cancelled = _job(jobs, "video_b", url=HOOK, events=("video.completed",))
    assert jobs.cancel(cancelled)
    # its own URL wants completions only, but the key's endpoint of that URL wants all
    urls = [r["url"] for r in jobs.outbox.deliveries(cancelled)]
    assert urls == ["https://hooks.example.com/key", HOOK, "https://hooks.example.com/cancels"]
    assert [r["event_type"] for r in jobs.outbox.deliveries(cancelled)] == ["video.cancelled"] * 3


def test_claims_do_not_overlap_and_lapse_with_their_lease(
    sessions: sessionmaker[Session],
) -> None:
    jobs = JobStore(sessions)
    for i in range(5):
        _complete(jobs, _job(jobs, f"video_{i}", url=HOOK))
    outbox = WebhookOutbox(sessions)
    now = time.time() + 1  # every row is due (queued at time.time())
    first = outbox.claim("one", limit=3, lease_s=30, now=now)
    second = outbox.claim("two", limit=10, lease_s=30, now=now)
    assert len(first) == 3 and len(second) == 2
    assert not {c.id for c in first} & {c.id for c in second}
    assert outbox.claim("three", limit=10, lease_s=30, now=now + 1) == []
    lapsed = outbox.claim("three", limit=10, lease_s=30, now=now + 31)  # senders died
    assert sorted(c.id for c in lapsed) == sorted(c.id for c in first + second)

    claimed = lapsed[0]
    retry = Attempt("retry", now + 31, 0.5, (503, None), next_attempt_at=now + 40)
    assert not outbox.record(claimed, "one", retry)  # that claim passed to "three"
    assert outbox.record(claimed, "three", retry)
    [row] = outbox.deliveries(claimed.job_id)
    assert row["status"] == "pending" and row["attempts"] == 1
    assert row["next_attempt_at"] == now + 40 and row["claim_token"] is None
    assert [a["status_code"] for a in row["attempts_made"]] == [503, 503]  # both kept
    [again] = outbox.claim("four", limit=1, lease_s=30, now=now + 40)
    assert again.id == claimed.id and again.attempts == 1
    assert outbox.record(again, "four", Attempt("delivered", now + 40, 0.1, (204, None)))
    [row] = outbox.deliveries(claimed.job_id)
    assert row["status"] == "delivered" and row["finished_at"] == pytest.approx(now + 40.1)
    rest = outbox.claim("five", limit=10, lease_s=30, now=now + 10_000)  # "three"'s lapsed
    assert len(rest) == 4 and claimed.id not in {c.id for c in rest}


def test_the_sweep_queues_what_a_crash_left_out(sessions: sessionmaker[Session]) -> None:
    jobs = JobStore(sessions)
    job = _job(jobs, "video_lost", url=HOOK)
    plain = _job(jobs, "video_plain")  # no destination: never swept
    _complete(jobs, job)
    _complete(jobs, plain)
    with sessions() as s:  # as if the worker died between the UPDATE and the insert
        s.execute(delete(WebhookDelivery))
        s.commit()
    assert jobs.outbox.sweep(since=1001.0) == 0  # ended before the window
    assert jobs.outbox.sweep(since=999.0) == 1
    assert [r["event_id"] for r in jobs.outbox.deliveries(job)] == [event_id(job)]
    assert jobs.outbox.deliveries(plain) == []


def test_secrets_are_made_once_and_rotate_with_grace(sessions: sessionmaker[Session]) -> None:
    store = WebhookStore(sessions)
    first = store.secret("key_a")
    assert first.startswith("whsec_") and store.secret("key_a") == first
    assert store.signing_secrets("key_a", grace_s=60) == [first]
    rotated = store.rotate("key_a")
    assert store.secret("key_a") == rotated != first
    assert store.signing_secrets("key_a", grace_s=60) == [rotated, first]
    assert store.signing_secrets("key_a", grace_s=0) == [rotated]
    assert store.secret("key_b") not in (first, rotated)
