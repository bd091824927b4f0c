"""The reconciler against real PostgreSQL, Redis and S3 (driven directly, pass by pass)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy

from cli.embedded import EmbeddedS3
from migrations.runner import upgrade
from models.db import Artifact, Job
from storage.artifacts import ArtifactStore, make_s3_client
from storage.constants import job_events_key
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.queue import JobQueue, make_celery
from storage.settings import Settings
from storage.worker_presence import WorkerPresence
from tests.helpers import video_spec
from tests.integration.conftest import new_pg_database, service_settings
from workers.jobs.temp_dirs import TempDirs
from workers.services.reconciler import LOCK_KEY, Reconciler

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def own_pg_url() -> Iterator[str]:
    """A database of this module alone: the reconciler acts on every job it finds, so the
    queued rows other modules leave in the session's database must not reach it."""
    with new_pg_database() as url:
        upgrade(url)
        yield url


@pytest.fixture
def parts(
    own_pg_url: str, s3_server: EmbeddedS3, redis_db: int
) -> Iterator[tuple[Reconciler, JobStore, Settings]]:
    worker = {"heartbeat_timeout_s": 5, "max_attempts": 2, "stale_upload_s": 0}
    settings = service_settings(own_pg_url, s3_server, redis_db=redis_db, worker=worker)
    engine = make_engine(settings.database)
    with engine.begin() as conn:  # each test starts with no job (artifacts cascade)
        conn.execute(sqlalchemy.text("DELETE FROM jobs"))
    jobs = JobStore(make_sessionmaker(engine))
    artifacts = ArtifactStore(make_s3_client(settings.s3), settings.s3)
    r = redis.Redis.from_url(settings.redis.url)
    r.flushdb()
    rec = Reconciler(settings, jobs, artifacts, JobQueue(make_celery(settings)), r)
    yield rec, jobs, settings
    r.flushdb()
    r.close()
    rec.queue.close()
    engine.dispose()


def _job(jobs: JobStore, job_id: str, **values: object) -> Job:
    job, _ = jobs.create(
        Job.new(video_spec(), id=job_id, owner="local", **values), idempotency_window_s=0
    )
    return job


def test_expired_artifacts_are_deleted(parts: tuple[Reconciler, JobStore, Settings]) -> None:
    rec, jobs, _ = parts
    vid = f"video_exp{time.time_ns()}"
    past = time.time() - 10
    key = f"videos/{vid}/output/video.mp4"
    rec.artifacts.put_bytes(key, b"mp4", "video/mp4")
    _job(jobs, vid, status="completed", completed_at=past - 5, expires_at=past)
    with jobs._sessions() as s:
        s.add(
            Artifact(
                job_id=vid,
                variant="video",
                bucket=rec.artifacts.bucket,
                key=key,
                content_type="video/mp4",
                size_bytes=3,
                created_at=past,
            )
        )
        s.commit()
    report = rec.run_once()
    assert report is not None and vid in report.expired
    assert rec.artifacts.list_keys(f"videos/{vid}/") == []
    assert jobs.artifact(vid, "video") is None
    assert jobs.get(vid).status == "completed"  # the record stays; content answers 410
    again = rec.run_once()
    assert again is not None and vid not in again.expired  # idempotent


def test_lost_worker_jobs_are_requeued_once_then_failed(
    parts: tuple[Reconciler, JobStore, Settings],
) -> None:
    rec, jobs, _ = parts
    stale = time.time() - 60
    retry = _job(
        jobs,
        f"video_lost{time.time_ns()}",
        status="in_progress",
        attempt=1,
        worker_id="gone:1:w",
        heartbeat_at=stale,
    )
    spent = _job(
        jobs,
        f"video_dead{time.time_ns()}",
        status="in_progress",
        attempt=2,
        worker_id="gone:1:w",
        heartbeat_at=stale,
    )
    rec.artifacts.put_bytes(f"videos/{spent.id}/output/video.mp4", b"partial", "video/mp4")
    report = rec.run_once()
    assert report is not None
    assert retry.id in report.requeued and spent.id in report.worker_lost
    failed = jobs.get(spent.id)
    assert (failed.status, failed.error_code) == ("failed", "worker_lost")
    assert rec.artifacts.list_keys(f"videos/{spent.id}/") == []
    # the re-enqueue marker keeps the next passes from flooding the queue
    assert rec.redis.ttl(f"oq:reconciler:requeued:{retry.id}") > 0
    assert retry.id not in (rec.run_once() or report).requeued
    queued = rec.redis.llen("jobs.reference-video")
    assert queued == 1


def test_queued_jobs_of_a_model_no_live_worker_can_load_fail_model_unavailable(
    parts: tuple[Reconciler, JobStore, Settings],
) -> None:
    rec, jobs, _ = parts
    n = time.time_ns()
    gone = jobs.create(
        Job.new(video_spec(model="acme/gone"), id=f"video_gone{n}", owner="local"),
        idempotency_window_s=0,
    )[0]
    rec.artifacts.put_bytes(f"videos/{gone.id}/input/reference.png", b"png", "image/png")
    running = jobs.create(
        Job.new(video_spec(model="acme/gone"), id=f"video_run{n}", owner="local"),
        idempotency_window_s=0,
    )[0]
    assert jobs.claim(running.id, "w:1:w")  # claimed: no pass of this kind touches it
    served = jobs.create(
        Job.new(video_spec(model="acme/served"), id=f"video_srv{n}", owner="local"),
        idempotency_window_s=0,
    )[0]
    presence = WorkerPresence(rec.redis)
    reason = "path /weights/gone does not exist"
    presence.renew([], "h:1:w0", 30, {"acme/gone": reason, "acme/served": reason}, "h:w0")
    presence.renew(["acme/served"], "h:2:w1", 30)  # another worker loaded this one
    report = rec.run_once()
    assert report is not None and report.unavailable == [gone.id]
    ended, claimed, waiting = (jobs.get(j.id) for j in (gone, running, served))
    assert ended is not None and claimed is not None and waiting is not None
    assert (ended.status, ended.error_code) == ("failed", "model_unavailable")
    assert ended.error_message == f"no live worker can load model 'acme/gone': {reason}"
    assert rec.artifacts.list_keys(f"videos/{gone.id}/") == []
    assert claimed.status == "in_progress" and waiting.status == "queued"
    events = rec.redis.xrange(job_events_key(gone.id))
    assert b'"model_unavailable"' in events[-1][1][b"event"]  # its watchers were told
    again = rec.run_once()
    assert again is not None and again.unavailable == []


def test_stale_multipart_uploads_are_aborted(parts: tuple[Reconciler, JobStore, Settings]) -> None:
    rec, _, _ = parts
    key = f"videos/video_mpu{time.time_ns()}/output/video.mp4"
    rec.artifacts.client.create_multipart_upload(Bucket=rec.artifacts.bucket, Key=key)
    time.sleep(1.1)
    report = rec.run_once()
    assert report is not None and report.aborted_uploads >= 1
    assert list(rec.artifacts.iter_uploads(key)) == []


def test_one_pass_at_a_time(parts: tuple[Reconciler, JobStore, Settings]) -> None:
    rec, _, _ = parts
    rec.redis.set(LOCK_KEY, "someone-else", ex=30)
    assert rec.run_once() is None
    rec.redis.delete(LOCK_KEY)
    assert rec.run_once() is not None
    assert rec.redis.get(LOCK_KEY) is None


class _TakeoverRedis(redis.Redis):
    """A Redis client whose lock expires, and another worker takes it, right after the
    first command that reads or releases the lock once the pass is over (the worst moment
    for a check-then-delete release)."""

    armed = False
    other: redis.Redis | None = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        result = super().execute_command(*args, **options)
        touches_lock = args[0] in ("GET", "EVALSHA", "EVAL") and LOCK_KEY in map(str, args)
        if self.armed and touches_lock:
            self.armed = False
            assert self.other is not None
            self.other.delete(LOCK_KEY)  # our lock expired...
            assert self.other.set(LOCK_KEY, "worker-b", nx=True, ex=30)  # ...B took it
        return result


@pytest.mark.parametrize("takeover", ["after_check", "before_release"])
def test_expired_holder_cannot_delete_the_new_holders_lock(
    parts: tuple[Reconciler, JobStore, Settings],
    monkeypatch: pytest.MonkeyPatch,
    takeover: str,
) -> None:
    rec, jobs, settings = parts
    racy = _TakeoverRedis.from_url(settings.redis.url)
    racy.other = rec.redis
    holder = Reconciler(settings, jobs, rec.artifacts, rec.queue, racy)
    last_step = Reconciler._stale_uploads

    def end_of_pass(self: Reconciler, report: Any) -> None:
        last_step(self, report)
        if takeover == "before_release":  # the pass outlived the lock's ttl
            rec.redis.delete(LOCK_KEY)
            assert rec.redis.set(LOCK_KEY, "worker-b", nx=True, ex=30)
        else:
            racy.armed = True

    monkeypatch.setattr(Reconciler, "_stale_uploads", end_of_pass)
    try:
        assert holder.run_once() is not None  # the pass itself completes
        assert rec.redis.get(LOCK_KEY) == b"worker-b"
        assert rec.run_once() is None  # B's lock still keeps the others out
    finally:
        racy.close()


def test_sweep_removes_temp_dirs_of_ended_jobs_and_dead_workers(
    parts: tuple[Reconciler, JobStore, Settings], tmp_path: Path
) -> None:
    _, jobs, _ = parts
    done = _job(jobs, f"video_sw1{time.time_ns()}", status="failed")
    mine = _job(
        jobs,
        f"video_sw2{time.time_ns()}",
        status="in_progress",
        worker_id=f"{socket.gethostname()}:{os.getpid()}:w",
    )
    dead = _job(
        jobs,
        f"video_sw3{time.time_ns()}",
        status="in_progress",
        worker_id=f"{socket.gethostname()}:999999999:w",
    )
    names = [f"omniq-{j}-abc123" for j in (done.id, mine.id, dead.id)]
    unknown_old, unknown_new = "omniq-video_gone1-abc", "omniq-video_gone2-abc"
    session = "omniq-rtv_0123456789-abc"
    for name in [*names, unknown_old, unknown_new, session]:
        (tmp_path / name).mkdir()
    old = time.time() - 7200
    os.utime(tmp_path / unknown_old, (old, old))
    # a run of this process still uses the directory of a job that ended elsewhere (a
    # zombie's, taken over): kept while the run lasts
    ended = _job(jobs, f"video_sw4{time.time_ns()}", status="completed")
    temp_dirs = TempDirs(tmp_path)
    live = temp_dirs.make(ended.id)
    assert temp_dirs.sweep(jobs, unknown_after_s=3600) == 3
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([names[1], unknown_new, session, live.name])
    temp_dirs.remove(live)  # the run ended: its directory goes
    assert not live.exists() and temp_dirs.live == set()


def test_a_queued_job_whose_message_was_lost_is_put_on_the_broker_again(
    parts: tuple[Reconciler, JobStore, Settings],
) -> None:
    """A job queued past ``lost_message_after_s`` while its model's queue holds no
    message (the broker lost it) gets a new one, once per window; a job whose queue
    still holds messages, or a job queued only just now, gets none."""
    rec, jobs, settings = parts
    after = settings.worker.lost_message_after_s
    old = time.time() - after - 5
    lost = _job(jobs, f"video_lostmsg{time.time_ns()}", created_at=old)
    fresh = _job(jobs, f"video_fresh{time.time_ns()}")
    rec.redis.delete("jobs.reference-video")
    report = rec.run_once()
    assert report is not None and report.redispatched == [lost.id]
    messages = rec.redis.lrange("jobs.reference-video", 0, -1)
    assert sum(lost.id.encode() in m for m in messages) == 1
    assert fresh.id not in report.redispatched
    again = rec.run_once()  # its queue holds a message now, and the window is not over
    assert again is not None and again.redispatched == []
    rec.redis.delete("jobs.reference-video")
    assert (rec.run_once() or again).redispatched == []  # once per window
    jobs.cancel(lost.id)
