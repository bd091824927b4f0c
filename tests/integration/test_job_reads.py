"""Status reads: one thread-pool hop per GET through the real app (PostgreSQL, Redis,
SeaweedFS), and the database side on SQLite and PostgreSQL: a page's queue positions in
one statement, and connections the pool keeps instead of reopening."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import OperationalError

from api.app import create_app
from api.state import AppState
from cli.embedded import EmbeddedS3
from migrations.runner import upgrade
from models.db import Job, JobStatus
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.settings import DatabaseSettings
from tests.helpers import video_spec
from tests.integration.conftest import (
    _drop_pg_database,
    _new_pg_database,
    service_settings,
)

pytestmark = pytest.mark.integration

REDIS_DB = 7  # jobs created here are never run: no worker listens on this index


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    name = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'reads.db'}"
    else:
        name, url = _new_pg_database()
    upgrade(url)
    eng = make_engine(DatabaseSettings(url=url))
    try:
        yield eng
    finally:
        eng.dispose()
        if name is not None:
            _drop_pg_database(name)


def _job(job_id: str, model: str, created_at: float, status: str = "queued") -> Job:
    spec = video_spec(model=model)
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


def test_status_read_makes_one_thread_pool_hop(
    pg_url: str, s3_server: EmbeddedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create, GET /v1/videos/{id} and a list page hop to the thread pool once each
    (the database work); the state and service dependencies used to add one hop each,
    and a create's queue position another."""
    upgrade(pg_url)
    settings = service_settings(pg_url, s3_server, redis_db=REDIS_DB)
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
    name, url = _new_pg_database()
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
        _drop_pg_database(name)
