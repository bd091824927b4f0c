"""Real services for integration tests.

PostgreSQL and Redis are the machine's own (127.0.0.1:5432, trust auth; 127.0.0.1:6379):
each test session gets a fresh database and a Redis database index it flushes. The S3
server is SeaweedFS started here on free ports. The API and the Celery workers run as
real subprocesses (``omniqueue api`` / ``omniqueue worker``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import redis
from sqlalchemy import Engine, create_engine, text

from cli.embedded import EmbeddedS3
from migrations.runner import upgrade
from storage.db import make_engine
from storage.settings import DatabaseSettings, Settings
from tests.integration.stack import Stack

PG_ADMIN_URL = os.environ.get(
    "OMNIQ_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_BASE_URL = os.environ.get("OMNIQ_TEST_REDIS_URL", "redis://127.0.0.1:6379")
REDIS_DB = int(os.environ.get("OMNIQ_TEST_REDIS_DB", "9"))


@contextmanager
def running_s3(path: Path, bucket: str, stop_timeout: float = 3.0) -> Iterator[EmbeddedS3]:
    """A SeaweedFS S3 server with its data in ``path``, for the ``with`` block."""
    server = EmbeddedS3(path, bucket=bucket)
    server.start()
    try:
        yield server
    finally:
        server.stop(timeout=stop_timeout)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    with running_s3(tmp_path_factory.mktemp("s3"), "omniqueue-test") as server:
        yield server


def _new_pg_database() -> tuple[str, str]:
    name = f"oq_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return name, PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def _drop_pg_database(name: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session."""
    name, url = _new_pg_database()
    try:
        yield url
    finally:
        _drop_pg_database(name)


@contextmanager
def flushed_redis(url: str) -> Iterator[redis.Redis]:
    """A client of the Redis database ``url``, emptied before and after the block."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = f"{REDIS_BASE_URL}/{REDIS_DB}"
    with flushed_redis(url):
        yield url


def service_settings(
    database_url: str, s3: EmbeddedS3, *, redis_db: int, **groups: Any
) -> Settings:
    """Settings for in-process code on the test services: ``database_url``, Redis index
    ``redis_db``, the shared S3 server; auth off and no ``.env`` unless ``groups`` say."""
    return Settings(  # type: ignore[call-arg]
        database={"url": database_url},
        redis={"url": f"{REDIS_BASE_URL}/{redis_db}"},
        s3={
            "endpoint_url": s3.endpoint_url,
            "bucket": s3.bucket,
            "access_key_id": s3.access_key,
            "secret_access_key": s3.secret_key,
        },
        **{"auth": "off", "_env_file": None, **groups},
    )


_S = TypeVar("_S", bound=Stack)


@contextmanager
def isolated_stack(
    work: Path,
    s3: EmbeddedS3,
    *,
    redis_db: int,
    extra_env: dict[str, str],
    workers: int = 1,
    realtime_workers: int = 0,
    cls: type[_S] = Stack,  # type: ignore[assignment]
    auth: str = "off",
) -> Iterator[_S]:
    """A deployment of its own: a fresh PostgreSQL database, its own Redis index (so
    no other test's worker takes its jobs), auth off unless asked, on the shared S3 server."""
    db_name, url = _new_pg_database()
    upgrade(url)
    redis_url = f"{REDIS_BASE_URL}/{redis_db}"
    redis.Redis.from_url(redis_url).flushdb()
    st = cls(
        work=work, database_url=url, redis_url=redis_url, s3=s3, auth=auth, extra_env=extra_env
    )
    try:
        yield st
    finally:
        st.stop()
        redis.Redis.from_url(redis_url).flushdb()
        _drop_pg_database(db_name)


@contextmanager
def started_stack(
    tmp_path_factory: pytest.TempPathFactory,
    s3: EmbeddedS3,
    name: str,
    *,
    redis_db: int,
    workers: int = 1,
    extra_env: dict[str, str] | None = None,
    auth: str = "off",
) -> Iterator[Stack]:
    """:func:`isolated_stack` in a fresh temporary directory, started with ``workers``
    job workers."""
    work = Path(tmp_path_factory.mktemp(name))
    with isolated_stack(work, s3, redis_db=redis_db, extra_env=extra_env or {}, auth=auth) as st:
        st.start(workers=workers)
        yield st


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A migrated database, once on SQLite and once on a fresh PostgreSQL database."""
    name = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'test.db'}"
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


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, pg_url: str, redis_url: str
) -> Iterator[Stack]:
    """API + one worker on PostgreSQL, Redis and SeaweedFS, auth required."""
    upgrade(pg_url)
    work = tmp_path_factory.mktemp("stack")
    st = Stack(
        work=Path(work),
        database_url=pg_url,
        redis_url=redis_url,
        s3=s3_server,
        auth="required",
    )
    st.start(workers=1)
    try:
        yield st
    finally:
        st.stop()


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    """An API key of ``stack`` (a module's own stack where it overrides ``stack``)."""
    return stack.create_key("alice")


@pytest.fixture(scope="module")
def client(stack: Stack, key: str) -> Iterator[httpx.Client]:
    """An HTTP client of ``stack`` that sends ``key``."""
    with stack.client(key) as c:
        yield c
