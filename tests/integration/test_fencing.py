"""Fencing by attempt number: a worker cut off mid-job, presumed dead and taken over (a
zombie), writes nothing of consequence once it is back.

In process, on real PostgreSQL, Redis and S3: two executors (two "hosts") of the same
deployment. Attempt 1 sleeps just before its upload (a failpoint; its heartbeat interval
is longer than the test, so it looks dead); attempt 2 takes the job over and completes
it; then attempt 1 wakes, uploads and ends. The job's row, objects and events must be
attempt 2's alone. The cluster form, with a real network partition, is
``tests/cluster/test_faults.py::test_a_zombie_worker_writes_nothing``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from cli.embedded import EmbeddedS3
from migrations.runner import upgrade
from models.db import Job
from models.events import DoneEvent, ProgressEvent, StatusEvent
from models.job_specs import VideoSpec
from storage.artifacts import ArtifactStore, make_s3_client
from storage.bus import EventBus
from storage.constants import job_events_key
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore, Lease
from storage.settings import Settings
from tests.helpers import s3_settings
from tests.integration.conftest import RedisDbPool, new_pg_database
from workers.jobs.executor import StepExecutor
from workers.jobs.objects import drop_other_attempts, output_prefix, stale_prefix
from workers.pipelines.registry import PipelineRegistry

pytestmark = pytest.mark.integration

MODEL = "reference/video"


@pytest.fixture
def database_url() -> Iterator[str]:
    """A database of this test's own: a queued job of another test in the session's
    database would be run (fair share) by the message meant for the take-over, and the
    session's workers would see this test's job."""
    with new_pg_database() as url:
        upgrade(url)
        yield url


@pytest.fixture
def settings(
    tmp_path: Path,
    database_url: str,
    redis_db: int,
    redis_pool: RedisDbPool,
    s3_server: EmbeddedS3,
) -> Settings:
    return Settings(
        database={"url": database_url},
        redis={"url": redis_pool.url(redis_db)},
        s3=s3_settings(s3_server),
        worker={
            "tmp_dir": str(tmp_path),
            "failpoints_file": str(tmp_path / "failpoints.json"),
            "heartbeat_s": 600,  # attempt 1 must look dead while it sleeps
            "heartbeat_timeout_s": 1,
        },
    )


@pytest.fixture
def executors(settings: Settings) -> Iterator[tuple[StepExecutor, StepExecutor]]:
    engine = make_engine(settings.database)
    client = redis.Redis.from_url(settings.redis.url)
    served = settings.served_models()
    pipelines = PipelineRegistry({MODEL: served[MODEL]}, "cpu")
    artifacts = ArtifactStore(make_s3_client(settings.s3), settings.s3)
    jobs = JobStore(make_sessionmaker(engine))
    bus = EventBus(client, ttl_s=600)
    made = tuple(
        StepExecutor(settings, jobs, artifacts, pipelines, worker_id=f"host-{h}:1:w", bus=bus)
        for h in "ab"
    )
    yield made  # type: ignore[misc]
    client.close()
    engine.dispose()


ZOMBIE_SLEEP_S = 12


def _job(executor: StepExecutor) -> Job:
    spec = VideoSpec(
        model=MODEL, prompt="a ball", seed=3, num_inference_steps=4, width=64, height=48,
        num_frames=8, fps=16,
    )  # fmt: skip
    job = Job.new(spec, id=f"video_{uuid.uuid4().hex}", owner="local")
    executor.jobs.create(job, idempotency_window_s=60)
    return job


def _age_heartbeat(executor: StepExecutor, job_id: str) -> None:
    """What a lapsed heartbeat looks like: the row's last one a minute ago."""
    engine = make_engine(executor.settings.database)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET heartbeat_at = heartbeat_at - 60 WHERE id = :id"), {"id": job_id}
        )
    engine.dispose()


def _wait_log(caplog: pytest.LogCaptureFixture, needle: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(needle in r.getMessage() for r in caplog.records):
            return
        time.sleep(0.02)
    raise AssertionError(f"no log line {needle!r}")


def test_a_zombie_attempt_writes_no_row_object_or_event(
    executors: tuple[StepExecutor, StepExecutor], caplog: pytest.LogCaptureFixture
) -> None:
    zombie, successor = executors
    job = _job(zombie)
    Path(zombie.settings.worker.failpoints_file or "").write_text(
        # long enough for attempt 2 to take over and complete first on a loaded machine
        json.dumps({"upload@attempt1": f"sleep:{ZOMBIE_SLEEP_S}"})
    )
    caplog.set_level("INFO")
    outcomes: dict[str, str] = {}
    first = threading.Thread(target=lambda: outcomes.update(a=zombie.run(job.id, MODEL)))
    first.start()
    _wait_log(caplog, f"failpoint upload@attempt1: sleep:{ZOMBIE_SLEEP_S}")
    _age_heartbeat(zombie, job.id)
    assert successor.run(job.id, MODEL) == "completed"  # attempt 2 took it over
    done = successor.jobs.get(job.id)
    assert done is not None and (done.status, done.attempt) == ("completed", 2)
    first.join(30)
    assert outcomes == {"a": "cancelled"}  # it learned it had lost the job, and stopped

    # The row: attempt 2's completion, untouched.
    row = successor.jobs.get(job.id)
    assert row is not None and (row.status, row.worker_id, row.attempt) == (
        "completed",
        "host-b:1:w",
        2,
    )
    # The objects: attempt 2's output only, whole, and what the artifact rows name.
    keys = successor.artifacts.list_keys(f"videos/{job.id}/")
    prefix = output_prefix(job, 2)
    assert sorted(keys) == [
        prefix + "spritesheet.jpg",
        prefix + "thumbnail.jpg",
        prefix + "video.mp4",
    ]
    art = successor.jobs.artifact(job.id, "video")
    assert art is not None and art.key == prefix + "video.mp4"
    assert successor.artifacts.size(art.key) == art.size_bytes
    assert list(successor.artifacts.iter_uploads(f"videos/{job.id}/")) == []
    # The events: one done, the last; nothing of attempt 1 after attempt 2 began.
    assert zombie.bus is not None
    raw = zombie.bus.redis.xrange(job_events_key(job.id))
    attempts = [int(f.get(b"attempt", b"0")) for _, f in raw]
    types = [json.loads(f[b"event"])["type"] for _, f in raw]
    assert types.count("done") == 1 and types[-1] == "done"
    assert attempts == sorted(attempts) and attempts[-1] == 2


def test_a_fenced_publish_is_refused_after_a_later_attempt_or_the_end(
    executors: tuple[StepExecutor, StepExecutor],
) -> None:
    bus = executors[0].bus
    assert bus is not None
    stream = job_events_key(f"video_{uuid.uuid4().hex}")
    progress = ProgressEvent(progress=10, step=1, num_steps=4, stage="denoise")
    assert bus.publish(stream, StatusEvent(status="queued"))  # the API's, unfenced
    assert bus.publish_fenced(stream, StatusEvent(status="in_progress"), attempt=1)
    assert bus.publish_fenced(stream, progress, attempt=2)  # a take-over
    assert bus.publish_fenced(stream, progress, attempt=1) is None  # the zombie
    assert bus.publish_fenced(stream, progress, b"\x00\x01", attempt=2)
    assert bus.publish_fenced(stream, DoneEvent(status="completed"), attempt=2)
    assert bus.publish_fenced(stream, progress, attempt=3) is None  # nothing after done
    entries = bus.read(stream)
    assert [e.type for e in entries] == ["status", "status", "progress", "progress", "done"]
    assert entries[3].data == b"\x00\x01"
    assert 0 < bus.redis.ttl(stream) <= 600


def test_what_a_run_that_did_not_complete_may_delete(
    executors: tuple[StepExecutor, StepExecutor],
) -> None:
    ex = executors[0]
    job = _job(ex)
    mine, theirs = Lease(ex.worker_id, 1), Lease("host-b:1:w", 2)
    assert ex.jobs.claim(job.id, mine.worker_id)
    # still running (ours or, after a take-over, another's): only our attempt's output
    assert stale_prefix(ex.jobs, job, mine) == output_prefix(job, 1)
    for attempt in (1, 2):
        ex.artifacts.put_bytes(output_prefix(job, attempt) + "video.mp4", b"x", "video/mp4")
    ex.artifacts.put_bytes(f"videos/{job.id}/input/reference.png", b"png", "image/png")
    assert drop_other_attempts(ex.artifacts, job, 2) == 1
    assert sorted(ex.artifacts.list_keys(f"videos/{job.id}/")) == [
        f"videos/{job.id}/input/reference.png",
        output_prefix(job, 2) + "video.mp4",
    ]
    # ended without completing: everything of the job
    assert ex.jobs.cancel(job.id)
    assert stale_prefix(ex.jobs, job, theirs) == f"videos/{job.id}/"
