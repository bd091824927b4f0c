"""The database side of status reads, on SQLite and PostgreSQL: a page's queue positions in
one statement, and connections the pool keeps instead of reopening."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from migrations.runner import upgrade
from models.db import Job, JobStatus
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.settings import DatabaseSettings
from tests.integration.conftest import _drop_pg_database, _new_pg_database

pytestmark = pytest.mark.integration


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
    return Job(
        id=job_id,
        kind="video",
        owner="local",
        model=model,
        status=status,
        prompt="p",
        params={},
        width=64,
        height=48,
        fps=16,
        num_frames=8,
        seed=1,
        num_inference_steps=1,
        has_audio=False,
        progress=0,
        step=0,
        stage="queue",
        stage_durations={},
        created_at=created_at,
        attempt=0,
        cancel_requested=False,
    )


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
