"""Admission above saturation (``api/queue_admission.py``): the queue bound (429
``queue_full``), ``ttl`` (``ttl_expired``) and ``estimated_start_at``, on the job store
(SQLite and PostgreSQL) and through the real stack: API and worker processes on
PostgreSQL, Redis and SeaweedFS."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import Engine, select

from api.queue_admission import QueueFigures
from cli.embedded import EmbeddedS3
from models.db import Job, JobStatus
from models.webhooks import JobWebhook
from storage.constants import presence_key
from storage.db import make_sessionmaker
from storage.jobs import JobStore, Lease
from storage.outbox import DELIVERIES
from storage.worker_presence import PresenceLease, WorkerPresence
from tests.helpers import video_spec
from tests.integration.conftest import REDIS_BASE_URL, isolated_stack
from tests.integration.stack import Stack

pytestmark = pytest.mark.integration

TINY = {"prompt": "a lighthouse", "size": "64x48", "seconds": "0.5", "num_inference_steps": 2}


# ---- the store ----------------------------------------------------------------------


@pytest.fixture
def store(engine: Engine) -> JobStore:
    return JobStore(make_sessionmaker(engine))


def _job(store: JobStore, job_id: str, *, ttl_s: int | None, age_s: float, **kw: object) -> Job:
    job = Job.new(
        video_spec(ttl_s=ttl_s), id=job_id, owner="k", created_at=time.time() - age_s, **kw
    )
    store.create(job, idempotency_window_s=60)
    return job


def test_a_queued_job_past_its_ttl_is_never_claimed_and_ends_ttl_expired(store: JobStore) -> None:
    hooked = video_spec(ttl_s=5, webhook=JobWebhook(url="https://hooks.example/a"))
    old_job = Job.new(hooked, id="video_old", owner="k", created_at=time.time() - 10)
    store.create(old_job, idempotency_window_s=60)
    _job(store, "video_fresh", ttl_s=60, age_s=10)
    _job(store, "video_none", ttl_s=None, age_s=5)
    assert not store.claim("video_old", "w1")  # past its ttl: not claimable
    assert store.claim_next("reference/video", "w1").id == "video_fresh"  # type: ignore[union-attr]
    running = _job(store, "video_running", ttl_s=5, age_s=1)
    assert store.claim(running.id, "w1")
    time.sleep(0.01)
    # a job that started is not touched by its ttl, one without a ttl never expires
    ended = store.expire_ttl(time.time() + 10)
    assert ended == [("video_old", "video", "reference/video")]
    old = store.get("video_old")
    assert old is not None and old.status == JobStatus.FAILED and old.error_code == "ttl_expired"
    assert old.started_at is None and old.completed_at is not None
    assert store.get("video_running").status == JobStatus.IN_PROGRESS  # type: ignore[union-attr]
    assert store.get("video_none").status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert store.expire_ttl(time.time() + 10) == []  # once
    # its webhook delivery was queued as for any end: one, of the failed event
    with store._engine.connect() as conn:
        rows = conn.execute(
            select(DELIVERIES.c.job_id, DELIVERIES.c.event_type, DELIVERIES.c.url)
        ).all()
    assert [tuple(r) for r in rows] == [("video_old", "video.failed", "https://hooks.example/a")]
    assert store.count_queued("reference/video") == 1


def test_queue_figures_read_running_starts_and_recent_run_times(store: JobStore) -> None:
    for i in range(3):
        _job(store, f"video_q{i}", ttl_s=None, age_s=100 - i)
    _job(store, "video_other", ttl_s=None, age_s=1)
    assert store.claim("video_q0", "w1")
    assert store.complete("video_q0", Lease("w1", 1), [], started_at=1000.0, completed_at=1004.0)
    assert store.claim("video_q1", "w1")
    queued, starts, runs = store.queue_figures("reference/video", 10)
    assert queued == 2 and len(starts) == 1 and runs == [pytest.approx(4.0)]


def test_worker_presence_leases_expire_and_leave(redis_db: int) -> None:
    client = redis.Redis.from_url(f"{REDIS_BASE_URL}/{redis_db}")
    presence = WorkerPresence(client)
    presence.renew(["m/presence", "m/other"], "host:1:w0", 0.3)
    presence.renew(["m/presence"], "host:2:w1", 30)
    assert presence.count("m/presence") == 2 and presence.count("m/other") == 1
    assert client.ttl(presence_key("m/presence")) > 0  # the set itself expires
    time.sleep(0.4)  # w0 was killed: its lease runs out
    assert presence.count("m/presence") == 1 and presence.count("m/other") == 0
    lease = PresenceLease(presence, ["m/lease"], "host:3:w2", every_s=0.05, lease_s=1)
    try:
        end = time.monotonic() + 5
        while presence.count("m/lease") != 1:
            assert time.monotonic() < end
            time.sleep(0.01)
    finally:
        lease.stop()
    assert presence.count("m/lease") == 0  # a stopped worker leaves at once
    presence.leave(["m/presence"], "host:2:w1")
    assert presence.count("m/presence") == 0


def test_a_worker_that_batches_counts_as_its_jobs_at_once(redis_db: int) -> None:
    """A worker running 3 jobs of a model at once (``OMNIQ_WORKER__BATCH_SIZE``, its
    steps batched) counts as 3 for that model's estimates, as 1 for its other models, with
    a load failure recorded beside them; it leaves all of them."""
    client = redis.Redis.from_url(f"{REDIS_BASE_URL}/{redis_db}")
    presence = WorkerPresence(client)
    jobs = {"m/speech": 3}
    presence.renew(["m/speech", "m/video"], "host:4:w3", 30, {"m/gone": "no weights"}, "h:w3", jobs)
    presence.renew(["m/speech"], "host:5:w4", 30)
    assert presence.count("m/speech") == 4 and presence.count("m/video") == 1
    assert presence.availability(["m/gone"])["m/gone"].failures == ("no weights",)
    figures = QueueFigures(0.0, presence.count("m/speech"), (), 2.0)
    assert [figures.wait_s(p, 0.0) for p in (0, 3, 4)] == [0.0, 0.0, 2.0]
    presence.leave(["m/speech", "m/video"], "host:4:w3", jobs=jobs)
    assert presence.count("m/speech") == 1 and presence.count("m/video") == 0


# ---- the stack ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def qstack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, redis_db: int
) -> Iterator[Stack]:
    """An API with a queue bound of 2 and no worker yet; workers are started by tests."""
    work = Path(tmp_path_factory.mktemp("queue"))
    env = {
        "OMNIQ_QUEUE__MAX_DEPTH": "2",
        "OMNIQ_QUEUE__RETRY_AFTER_S": "77",
        "OMNIQ_QUEUE__ETA_REFRESH_S": "0.1",
        "OMNIQ_WORKER__RECONCILE_INTERVAL_S": "0.5",
        "OMNIQ_WORKER__HEARTBEAT_S": "0.5",
    }
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=0)
        yield st


def _wait(c: httpx.Client, job_id: str, status: str, timeout: float = 60) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = c.get(f"/v1/videos/{job_id}").json()
        if job["status"] == status:
            return job
        time.sleep(0.05)
    raise AssertionError(f"{job_id} did not reach {status}: {job}")


def _drain(st: Stack, c: httpx.Client) -> None:
    """Run every queued job to its end on a worker, then stop the worker (none to start
    when nothing is queued or running)."""
    jobs = c.get("/v1/videos", params={"limit": 100}).json()["data"]
    active = [job["id"] for job in jobs if job["status"] in ("queued", "in_progress")]
    if not active:
        return
    st.start_worker("drain")
    st.wait_workers(1)
    for job_id in active:
        end = time.monotonic() + 60
        while c.get(f"/v1/videos/{job_id}").json()["status"] in ("queued", "in_progress"):
            assert time.monotonic() < end
            time.sleep(0.05)
    st.stop_process("drain")


def test_queue_full_refuses_with_retry_after_and_stores_nothing(qstack: Stack) -> None:
    with qstack.client() as c:
        first = c.post("/v1/videos", json=TINY, headers={"Idempotency-Key": "q-1"})
        assert first.status_code == 200, first.text
        assert first.json()["estimated_start_at"] is None  # no worker: nothing to go on
        assert c.post("/v1/videos", json=TINY).status_code == 200
        rows = qstack.count_jobs()
        for send in (
            lambda: c.post("/v1/videos", json=TINY),
            lambda: c.post("/v1/videos", data={k: str(v) for k, v in TINY.items()}),
        ):
            refused = send()
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["code"] == "queue_full" and error["param"] == "model"
            assert "reference/video" in error["message"]
            # nothing measured yet: the configured fallback
            assert refused.headers["retry-after"] == "77"
        assert qstack.count_jobs() == rows
        # a retried create gets its job, queue full or not
        again = c.post("/v1/videos", json=TINY, headers={"Idempotency-Key": "q-1"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        _drain(qstack, c)


def test_retry_after_and_estimated_start_come_from_the_measured_run_time(qstack: Stack) -> None:
    with qstack.client() as c:
        _drain(qstack, c)
        qstack.start_worker("busy")
        qstack.wait_workers(1)
        try:
            measured = c.post("/v1/videos", json=TINY).json()  # a run time to go on
            _wait(c, measured["id"], "completed")
            qstack.set_failpoints({"step:0": "sleep:3"})
            blocker = c.post("/v1/videos", json=TINY).json()
            _wait(c, blocker["id"], "in_progress")
            waiting = [c.post("/v1/videos", json=TINY).json() for _ in range(2)]
            assert [w["queue_position"] for w in waiting] == [0, 1]
            etas = [w["estimated_start_at"] for w in waiting]
            now = time.time()
            assert all(isinstance(e, int) for e in etas), etas
            assert now - 1 <= etas[0] <= etas[1] <= now + 60
            refused = c.post("/v1/videos", json=TINY)
            assert refused.status_code == 429
            retry = int(refused.headers["retry-after"])
            assert retry != 77 and 1 <= retry <= 60  # from the measured drain, not the fallback
            read = c.get(f"/v1/videos/{waiting[1]['id']}").json()
            assert read["estimated_start_at"] is not None and read["queue_position"] == 1
            started = _wait(c, waiting[0]["id"], "in_progress")
            assert started["estimated_start_at"] is None and started["queue_position"] is None
        finally:
            qstack.set_failpoints({})
            qstack.stop_process("busy")
        _drain(qstack, c)


def test_ttl_expired_ends_a_queued_job_without_running_it(qstack: Stack) -> None:
    with qstack.client() as c:
        _drain(qstack, c)
        png = _png()
        files = {"input_reference": ("ref.png", png, "image/png")}
        form = {**{k: str(v) for k, v in TINY.items()}, "ttl": "1"}
        expiring = c.post("/v1/videos", data=form, files=files)
        assert expiring.status_code == 200, expiring.text
        job = expiring.json()
        assert job["ttl"] == 1
        s3 = qstack.s3.client()
        prefix = f"videos/{job['id']}/"
        assert s3.list_objects_v2(Bucket=qstack.s3.bucket, Prefix=prefix).get("KeyCount") == 1
        answers: list[httpx.Response] = []

        def wait_sync() -> None:
            with qstack.client(timeout=60) as waiter:
                answers.append(waiter.post("/v1/videos/sync", json={**TINY, "ttl": 1}))

        sync = threading.Thread(target=wait_sync)
        sync.start()
        time.sleep(1.5)  # their ttl passes while no worker runs
        qstack.start_worker("late")
        qstack.wait_workers(1)
        try:
            ended = _wait(c, job["id"], "failed", timeout=30)
            assert ended["error"]["code"] == "ttl_expired"
            assert ended["started_at"] is None and ended["progress"] == 0
            sync.join(60)
            (answer,) = answers  # /sync: 503 with the job's code
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "ttl_expired"
            end = time.monotonic() + 10  # its objects go right after the row ends
            while s3.list_objects_v2(Bucket=qstack.s3.bucket, Prefix=prefix).get("KeyCount"):
                assert time.monotonic() < end, "the expired job's reference was not deleted"
                time.sleep(0.05)
            # its watchers were told
            with c.stream("GET", f"/v1/videos/{job['id']}/events") as events:
                lines = [line for line in events.iter_lines() if line.startswith("data:")]
            done = json.loads(lines[-1][5:])
            assert done["type"] == "done" and done["error"]["code"] == "ttl_expired"
            # a job that started is not touched by its ttl
            qstack.set_failpoints({"step:0": "sleep:2"})
            slow = c.post("/v1/videos", json={**TINY, "ttl": 1}).json()
            assert _wait(c, slow["id"], "completed", timeout=60)["ttl"] == 1
        finally:
            qstack.set_failpoints({})
            qstack.stop_process("late")


@pytest.mark.parametrize("ttl", [0, -3, 1.5, "soon", 10**9, True])
def test_a_bad_ttl_is_a_400_naming_it_and_stores_nothing(qstack: Stack, ttl: object) -> None:
    with qstack.client() as c:
        rows = qstack.count_jobs()
        answer = c.post("/v1/videos", json={**TINY, "ttl": ttl})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "ttl"
        audio = c.post("/v1/audio/generations", json={"prompt": "rain", "seconds": 1, "ttl": ttl})
        assert audio.status_code == 400 and audio.json()["error"]["param"] == "ttl"
        assert qstack.count_jobs() == rows


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 40, 40)).save(buf, format="PNG")
    return buf.getvalue()
