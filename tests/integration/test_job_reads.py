"""Status reads: one thread-pool hop per GET through the real app (PostgreSQL, Redis,
SeaweedFS), and the database side on SQLite and PostgreSQL: a page's queue positions in
one statement, and connections the pool keeps instead of reopening."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import Engine, bindparam, event, insert, select, text
from sqlalchemy.exc import IntegrityError, OperationalError

from api.app import create_app
from api.state import AppState
from cli.embedded import EmbeddedS3
from migrations.runner import upgrade
from models.db import Artifact, ErrorCode, Job, JobStatus
from models.job_specs import AudioSpec
from storage.db import make_engine, make_sessionmaker
from storage.db_raw import RawStatement
from storage.job_statements import JOB_BY_ID, JOBS
from storage.job_statements import page as sql_page
from storage.jobs import JobStore, Lease
from storage.settings import DatabaseSettings
from tests.helpers import video_spec
from tests.integration.conftest import new_pg_database, service_settings

pytestmark = pytest.mark.integration
W1 = Lease("w1", 1)  # the first claim's lease


def _job(job_id: str, model: str, created_at: float, status: str = "queued") -> Job:
    spec = video_spec(model=model, num_inference_steps=1)
    return Job.new(spec, id=job_id, owner="local", status=status, created_at=created_at)


def test_queue_positions_of_a_page_in_one_statement(engine: Engine) -> None:
    store = JobStore(make_sessionmaker(engine))
    t = time.time()
    rows = [
        _job("video_a0", "m/a", t),
        _job("video_a1", "m/a", t + 1),
        _job("video_a2b", "m/a", t + 2),
        _job("video_a2a", "m/a", t + 2),  # same created_at: ties go by id
        _job("video_b0", "m/b", t + 1.5),
        _job("video_b1", "m/b", t + 3),
        _job("video_done", "m/a", t + 0.5, status=JobStatus.COMPLETED.value),
    ]
    for row in rows:
        store.create(row, idempotency_window_s=60)
    page, _ = store.page("local", after=None, limit=20, order="desc", kind="video")
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(engine, "before_cursor_execute", count)
    try:
        positions = store.queue_positions(page)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert positions == {
        "video_a0": 0,
        "video_a1": 1,
        "video_a2a": 2,
        "video_a2b": 3,
        "video_b0": 0,
        "video_b1": 1,
    }
    assert len(statements) == 1, statements


def _varied_jobs(t: float) -> list[Job]:
    """Rows that exercise every column type: JSON (spec, stage durations, output),
    booleans both ways, floats, big integers, NULLs, another owner."""
    spec = video_spec(
        model="m/a",
        prompt="p ü",
        seed=2**40,
        num_inference_steps=4,
        fps=12.5,
        has_audio=True,
        options={"guidance_scale": 3.5},
    )
    audio = AudioSpec(model="m/s", prompt="say", seed=3, num_inference_steps=2, duration_ms=1500)
    return [
        _job("video_r_queued", "m/a", t),
        Job.new(
            spec,
            id="video_r_done",
            owner="key_other",
            status=JobStatus.COMPLETED.value,
            created_at=t + 1,
            started_at=t + 1.25,
            completed_at=t + 2.5,
            expires_at=t + 99,
            stage_durations={"queue": 0.25, "denoise": 1.125},
            inference_time_s=1.5,
            peak_memory_mb=512.5,
            progress=100,
            step=4,
            stage="done",
            attempt=2,
            worker_id="worker-1",
            heartbeat_at=t + 2.5,
            deadline_at=t + 600,
        ),
        Job.new(
            spec,
            id="video_r_failed",
            owner="local",
            status=JobStatus.FAILED.value,
            created_at=t + 2,
            error_code="cancelled",
            error_message="cancelled by the client",
            cancel_requested=True,
            idempotency_key="idem-1",
        ),
        Job.new(
            audio,
            id="audio_r_done",
            owner="local",
            status=JobStatus.COMPLETED.value,
            created_at=t + 3,
            output={"sample_rate": 24000, "channels": 1, "num_samples": 36000},
        ),
    ]


def test_status_read_returns_the_row_the_orm_reads(engine: Engine) -> None:
    """The raw-cursor read (:class:`RawStatement`) gives every column as the ORM and a Core
    ``SELECT`` of the same row do: same values, same Python types."""
    store = JobStore(make_sessionmaker(engine))
    jobs = _varied_jobs(time.time())
    for job in jobs:
        store.create(job, idempotency_window_s=60)
    columns = list(JOBS.columns.keys())
    for job in jobs:
        record = store.read(job.id)
        assert record is not None
        with engine.connect() as conn:
            core = conn.execute(JOB_BY_ID, {"job_id": job.id}).one()._asdict()
        orm = store.get(job.id)
        assert orm is not None
        read = vars(record)
        assert list(read) == columns
        for name in columns:
            value = read[name]
            assert value == core[name] == getattr(orm, name), (job.id, name)
            assert type(value) is type(core[name]) is type(getattr(orm, name)), (job.id, name)
    assert store.read("video_r_done", owner="local") is None  # another owner's job
    assert store.read("video_r_done", owner="key_other") is not None
    assert store.read("video_nope") is None


def test_pages_are_the_rows_a_core_select_gives(engine: Engine) -> None:
    """List pages on the raw path: the rows (every column) and ``has_more`` of the same
    statements run through SQLAlchemy, both orders, with and without a cursor, ties on
    ``created_at`` broken by id, other owners' and other kinds' jobs left out."""
    store = JobStore(make_sessionmaker(engine))
    t = time.time()
    jobs = [_job(f"video_p{i}", "m/a", t + i // 2) for i in range(7)]  # pairs tie
    jobs += _varied_jobs(t + 10)  # another owner's job, an audio job
    for job in jobs:
        store.create(job, idempotency_window_s=60)
    page_statement = {(a, b): sql_page(a, b) for a in (True, False) for b in (True, False)}
    for order in ("asc", "desc"):
        for after in (None, "video_p2", "video_p5"):
            got, more = store.page("local", after=after, limit=3, order=order, kind="video")
            params: dict[str, Any] = {"owner": "local", "kind": "video", "limit": 4}
            with engine.connect() as conn:
                if after is not None:
                    cursor = conn.execute(JOB_BY_ID, {"job_id": after}).one()
                    params |= {"cursor_created_at": cursor.created_at, "cursor_id": cursor.id}
                statement = page_statement[(order == "asc", after is not None)]
                core = [r._asdict() for r in conn.execute(statement, params)]
            assert [vars(r) for r in got] == core[:3], (order, after)
            assert more == (len(core) > 3)
    with pytest.raises(KeyError):
        store.page("local", after="video_r_done", limit=3, order="desc", kind="video")


def test_a_create_without_a_key_writes_the_row_the_orm_writes(engine: Engine) -> None:
    """The raw INSERT of a create leaves unset columns SQL NULL (not JSON ``null``) and
    writes every other one as the ORM's flush does."""
    store = JobStore(make_sessionmaker(engine))
    t = time.time()
    store.create(_job("video_raw", "m/a", t), idempotency_window_s=60)
    with make_sessionmaker(engine)() as s:
        s.add(_job("video_orm", "m/a", t))
        s.commit()
    nulls = [c.is_(None).label(f"{c.key}_is_null") for c in JOBS.columns]
    with engine.connect() as conn:
        rows = {r.id: r._asdict() for r in conn.execute(select(JOBS, *nulls))}
    raw, orm = rows.pop("video_raw"), rows.pop("video_orm")
    raw.pop("id"), orm.pop("id")
    assert raw == orm
    assert raw["output_is_null"] and raw["error_code_is_null"]


def _artifact(job_id: str, variant: str, t: float) -> Artifact:
    return Artifact(
        job_id=job_id,
        variant=variant,
        bucket="b",
        key=f"videos/{job_id}/output/{variant}",
        content_type="video/mp4" if variant == "video" else "image/jpeg",
        size_bytes=2**33 + 5,
        created_at=t,
    )


def _orm_row(engine: Engine, job_id: str) -> Job:
    with make_sessionmaker(engine)() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def test_worker_transitions_write_what_the_orm_reads(engine: Engine) -> None:
    """claim → progress → complete (with artifacts) through the raw statements, read back
    with the ORM: each invariant holds (a second claim, a smaller progress and a lost
    owner change nothing) and written values keep their types (JSON, floats)."""
    store = JobStore(make_sessionmaker(engine))
    t = time.time()
    store.create(_job("video_w", "m/a", t), idempotency_window_s=60)
    assert store.claim("video_w", "w1")
    assert not store.claim("video_w", "w2")  # claimed already
    row = _orm_row(engine, "video_w")
    assert (row.status, row.worker_id, row.attempt, row.stage) == (
        "in_progress",
        "w1",
        1,
        "prepare",
    )
    assert row.started_at is not None and row.started_at == row.heartbeat_at
    assert store.still_owned("video_w", W1) and not store.still_owned("video_w", Lease("w2", 1))
    durations = {"queue": 0.25, "prepare": 0.125}
    assert store.update_running(
        "video_w", W1, progress=40, step=2, stage="denoise", stage_durations=durations
    )
    assert not store.update_running("video_w", W1, progress=30)  # never decreases
    assert not store.update_running("video_w", Lease("w2", 1), progress=50)  # not its owner
    row = _orm_row(engine, "video_w")
    assert (row.progress, row.step, row.stage, row.stage_durations) == (40, 2, "denoise", durations)
    assert not store.complete(
        "video_w", Lease("w2", 1), [_artifact("video_w", "video", t)], progress=100
    )
    assert store.artifact("video_w", "video") is None  # nothing inserted for a non-owner
    arts = [_artifact("video_w", "video", t + 1), _artifact("video_w", "thumbnail", t + 2)]
    assert not store.complete("video_w", Lease("w1", 2), arts, progress=100)  # a later attempt's
    assert store.complete(
        "video_w",
        W1,
        arts,
        progress=100,
        stage="done",
        completed_at=t + 3,
        stage_durations={**durations, "upload": 0.5},
        inference_time_s=1.5,
        peak_memory_mb=64.5,
    )
    row = _orm_row(engine, "video_w")
    assert (row.status, row.progress, row.stage, row.inference_time_s) == (
        "completed",
        100,
        "done",
        1.5,
    )
    assert row.stage_durations == {**durations, "upload": 0.5}
    assert not store.still_owned("video_w", W1)
    for art in arts:
        stored = store.artifact("video_w", art.variant)
        assert stored is not None and stored.id is not None
        got = {
            k: getattr(stored, k)
            for k in (
                "job_id",
                "variant",
                "bucket",
                "key",
                "content_type",
                "size_bytes",
                "created_at",
            )
        }
        assert got == {k: getattr(art, k) for k in got}
    found = store.read_with_artifact("video_w", "local", "thumbnail")
    assert found is not None
    record, artifact = found
    assert vars(record) == vars(store.read("video_w"))
    assert artifact is not None and artifact.key == arts[1].key
    missing = store.read_with_artifact("video_w", "local", "spritesheet")
    assert missing is not None and vars(missing[0]) == vars(record) and missing[1] is None
    assert store.read_with_artifact("video_w", "key_other", "video") is None


def test_claim_job_returns_the_row_a_read_after_the_claim_gives(engine: Engine) -> None:
    store = JobStore(make_sessionmaker(engine))
    store.create(_job("video_cj", "m/a", time.time()), idempotency_window_s=60)
    claimed = store.claim_job("video_cj", "w1")
    assert claimed is not None and claimed.status == "in_progress"
    read = store.get("video_cj")
    assert read is not None
    columns = list(JOBS.columns.keys())
    assert {c: getattr(claimed, c) for c in columns} == {c: getattr(read, c) for c in columns}
    assert store.claim_job("video_cj", "w2") is None  # claimed already: nothing written
    assert _orm_row(engine, "video_cj").worker_id == "w1"
    assert store.claim_job("video_nope", "w1") is None


def test_cancel_fail_and_take_over_keep_their_conditions(engine: Engine) -> None:
    store = JobStore(make_sessionmaker(engine))
    t = time.time()
    for job_id in ("video_c", "video_f", "video_t"):
        store.create(_job(job_id, "m/a", t), idempotency_window_s=60)
    # a cancelled job is not claimed, and a second cancel changes nothing
    assert store.cancel("video_c", "cancelled by the client")
    assert not store.cancel("video_c")
    assert not store.claim("video_c", "w1")
    row = _orm_row(engine, "video_c")
    assert (row.status, row.error_code, row.cancel_requested) == ("failed", "cancelled", True)
    # fail: only while active, and only by its owner when one is given
    assert store.claim("video_f", "w1")
    assert not store.fail("video_f", ErrorCode.OOM, "no memory", lease=Lease("w2", 1))
    assert store.fail("video_f", ErrorCode.OOM, "no memory", lease=W1, stage="denoise")
    assert not store.fail("video_f", ErrorCode.INTERNAL_ERROR, "again")
    row = _orm_row(engine, "video_f")
    assert (row.status, row.error_code, row.error_message, row.stage) == (
        "failed",
        "oom",
        "no memory",
        "denoise",
    )
    # take over: only a stale heartbeat, within the attempt bound
    assert store.claim("video_t", "w1")
    assert not store.take_over("video_t", "w2", stale_before=t - 60, max_attempts=3)
    assert not store.take_over("video_t", "w2", stale_before=time.time() + 1, max_attempts=1)
    assert store.take_over("video_t", "w2", stale_before=time.time() + 1, max_attempts=3)
    row = _orm_row(engine, "video_t")
    assert (row.worker_id, row.attempt, row.stage, row.step) == ("w2", 2, "prepare", 0)
    assert store.get("video_t") is not None and store.get("video_t", owner="key_other") is None


def test_raw_statement_errors_are_sqlalchemys(engine: Engine) -> None:
    """A driver error on the raw path is SQLAlchemy's exception (here the primary key's
    IntegrityError), and the connection goes back to the pool usable."""
    store = JobStore(make_sessionmaker(engine))
    store.create(_job("video_e", "m/a", time.time()), idempotency_window_s=60)
    duplicate = RawStatement(
        engine,
        insert(JOBS).from_select(
            list(JOBS.columns.keys()), select(JOBS).where(JOBS.c.id == bindparam("job_id"))
        ),
    )
    with pytest.raises(IntegrityError):
        duplicate.rowcount({"job_id": "video_e"})
    assert store.read("video_e") is not None


def test_pool_keeps_its_connections_under_concurrent_reads(engine: Engine) -> None:
    """Up to ``pool_size`` concurrent sessions, again and again, open each connection
    once (SQLite's default pool kept five and reopened the rest on every burst)."""
    store = JobStore(make_sessionmaker(engine))
    store.create(_job("video_x", "m/a", time.time()), idempotency_window_s=60)
    size = DatabaseSettings().pool_size
    opened: list[object] = []
    event.listen(engine, "connect", lambda conn, _record: opened.append(conn))
    barrier = threading.Barrier(size)

    def read() -> None:
        for _ in range(5):
            with store._sessions() as s:  # hold the connection until all have one
                s.get(Job, "video_x")
                barrier.wait(timeout=30)
                s.rollback()
            barrier.wait(timeout=30)

    threads = [threading.Thread(target=read) for _ in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(opened) <= size, f"{len(opened)} connections opened for {size} readers"


@pytest.fixture
def own_pg_url() -> Iterator[str]:
    """A migrated database of the test's own: the job it creates stays queued, and in the
    session's database the session stack's worker claimed it (fair share claims the
    model's next queued row) at the next module's first job, which waited ~40 s behind it."""
    with new_pg_database() as url:
        upgrade(url)
        yield url


def test_status_read_makes_one_thread_pool_hop(
    own_pg_url: str, s3_server: EmbeddedS3, redis_db: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create, GET /v1/videos/{id} and a list page hop to the thread pool once each
    (the database work); the state and service dependencies used to add one hop each,
    and a create's queue position another."""
    # jobs created here are never run: no worker listens on this module's index
    settings = service_settings(own_pg_url, s3_server, redis_db=redis_db)
    hops: list[str] = []
    real = anyio.to_thread.run_sync
    real_blocking = AppState.blocking

    def note(func: Any) -> None:
        target = getattr(func, "func", func)  # run_in_threadpool passes a partial
        hops.append(getattr(target, "__qualname__", repr(target)))

    async def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
        note(func)
        return await real(func, *args, **kwargs)

    async def counting_blocking(self: AppState, func: Any, *args: Any, **kwargs: Any) -> Any:
        note(func)
        return await real_blocking(self, func, *args, **kwargs)

    try:
        with TestClient(create_app(settings)) as client:
            body = {"prompt": "one hop", "size": "64x48", "seconds": "0.5", "fps": 16}
            monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
            monkeypatch.setattr(AppState, "blocking", counting_blocking)
            created = client.post("/v1/videos", json=body)
            video_id = created.json()["id"]
            create_hops = list(hops)
            hops.clear()
            status = client.get(f"/v1/videos/{video_id}")
            status_hops = list(hops)
            page = client.get("/v1/videos", params={"limit": 20})
            monkeypatch.undo()
    finally:
        redis.Redis.from_url(settings.redis.url).flushdb()
    assert created.status_code == 200, created.text
    assert created.json()["queue_position"] == status.json()["queue_position"]
    # the insert + enqueue and the queue position in one call
    assert create_hops == ["VideoService._persist"], create_hops
    assert status.status_code == 200 and status.json()["id"] == video_id
    assert status.json()["queue_position"] is not None
    assert page.status_code == 200 and video_id in [v["id"] for v in page.json()["data"]]
    assert status_hops == ["JobService.retrieve"], status_hops
    assert hops[len(status_hops) :] == ["VideoService.page"], hops


def _backend_pid(store: JobStore) -> int:
    with store._engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_dropped_postgresql_connection_idle_past_the_threshold_is_replaced() -> None:
    """A pooled connection the server dropped is pinged and replaced before a read uses it
    once it sat idle past ``ping_idle_s``; one used more recently is not pinged, so its
    read fails, and the pool is invalidated so the next read works (the trade-off of
    pinging only idle connections, a round trip less per status read)."""
    with new_pg_database() as url:
        upgrade(url)
        admin = make_engine(DatabaseSettings(url=url))
        try:
            for idle_s, survives in ((0.2, True), (60.0, False)):
                engine = make_engine(DatabaseSettings(url=url, pool_size=1, ping_idle_s=idle_s))
                store = JobStore(make_sessionmaker(engine))
                first = _backend_pid(store)
                with admin.connect() as conn:
                    conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
                    conn.commit()
                time.sleep(0.4)
                if survives:
                    assert store.read("video_nope") is None  # pinged, replaced, read
                    assert _backend_pid(store) != first
                else:
                    with pytest.raises(OperationalError):
                        store.read("video_nope")
                    assert store.read("video_nope") is None  # the pool was invalidated
                engine.dispose()
        finally:
            admin.dispose()
