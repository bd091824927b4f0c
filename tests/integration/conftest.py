"""Real services for integration tests.

PostgreSQL and Redis are the machine's own (127.0.0.1:5432, trust auth; 127.0.0.1:6379):
each test session gets a fresh database, and every module that needs Redis gets a
database index of its own from one pool (:class:`RedisDbPool`, fixtures ``redis_db`` and
``redis_pool``), leased on that Redis so two runs on it never share an index. The S3
server is SeaweedFS started here on free ports. The API and the Celery workers run as
real subprocesses (``omniqueue api`` / ``omniqueue worker``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
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
from tests.helpers import s3_settings
from tests.integration.audio_stack import AudioStack
from tests.integration.stack import Stack

PG_ADMIN_URL = os.environ.get(
    "OMNIQ_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_BASE_URL = os.environ.get("OMNIQ_TEST_REDIS_URL", "redis://127.0.0.1:6379")

# ``KEYS[1]`` still holds this run's token: renew it for ``ARGV[2]`` ms / delete it.
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0"""


class RedisDbPool:
    """The Redis database indexes this test run uses, each leased on the test Redis.

    A lease is the key ``omniq-test:redis-db:<index>`` in database 0 (never handed out),
    set only when absent, to this run's token: another run on the same Redis (another
    clone, another engineer) skips that index, so no worker of theirs can take our jobs
    and no flush of theirs can empty our queue. A thread renews the leases while the run
    lives; the leases of a run that was killed expire after ``ttl_ms``. An index is
    flushed when leased (a dead run may have left keys) and when released.

    ``ttl_ms`` is each pool's own: a test that shortens it for a pool of its own must not
    shorten the run's. (It once patched the class attribute: the run's renewer then set
    600 ms leases, slept 20 s once the patch was undone, and the other xdist process
    leased and flushed an index this one's session stack was using, whose worker then
    took and dropped the other's job messages.)
    """

    WAIT_S = 300.0  # for an index while other runs hold all of them

    def __init__(self, base_url: str, *, ttl_ms: int = 60_000) -> None:
        self.base_url = base_url
        self.ttl_ms = ttl_ms
        self._admin = redis.Redis.from_url(f"{base_url}/0")
        self._token = uuid.uuid4().hex
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renew = self._admin.register_script(_RENEW)
        self._release = self._admin.register_script(_RELEASE)
        self._count = self._databases()
        self._renewer = threading.Thread(target=self._keep, name="redis-db-leases", daemon=True)
        self._renewer.start()

    def url(self, db: int) -> str:
        return f"{self.base_url}/{db}"

    def lease(self) -> int:
        """A free database index, now this run's and empty."""
        deadline = time.monotonic() + self.WAIT_S
        while True:
            for db in range(1, self._count):
                if self._admin.set(self._key(db), self._token, nx=True, px=self.ttl_ms):
                    with self._lock:
                        self._held.add(db)
                    redis.Redis.from_url(self.url(db)).flushdb()
                    return db
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"all {self._count - 1} databases of {self.base_url} are leased by "
                    "other test runs"
                )
            time.sleep(0.5)

    def release(self, db: int) -> None:
        with self._lock:
            self._held.discard(db)
        redis.Redis.from_url(self.url(db)).flushdb()
        self._release(keys=[self._key(db)], args=[self._token])

    @contextmanager
    def leased(self) -> Iterator[int]:
        """:meth:`lease` for the ``with`` block."""
        db = self.lease()
        try:
            yield db
        finally:
            self.release(db)

    def close(self) -> None:
        self._stop.set()
        self._renewer.join()
        for db in list(self._held):
            self.release(db)
        self._admin.close()

    def _key(self, db: int) -> str:
        return f"omniq-test:redis-db:{db}"

    def _databases(self) -> int:
        try:
            return int(self._admin.config_get("databases")["databases"])
        except (redis.RedisError, KeyError, ValueError):  # CONFIG refused: the default
            return 16

    def _keep(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            with self._lock:
                held = list(self._held)
            for db in held:
                with contextlib.suppress(redis.RedisError):  # try again next round
                    self._renew(keys=[self._key(db)], args=[self._token, self.ttl_ms])


@contextmanager
def running_s3(path: Path, bucket: str, stop_timeout: float = 0.0) -> Iterator[EmbeddedS3]:
    """A SeaweedFS S3 server with its data in ``path``, for the ``with`` block."""
    server = EmbeddedS3(path, bucket=bucket)
    server.start()
    try:
        yield server
    finally:
        server.stop(timeout=stop_timeout)


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A directory of the test module's own (its stack's data, logs, registry files)."""
    return Path(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    with running_s3(tmp_path_factory.mktemp("s3"), "omniqueue-test") as server:
        yield server


def _pg_admin(statement: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(statement))
    admin.dispose()


@contextmanager
def new_pg_database() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped (its sessions too) after the
    block."""
    name = f"oq_test_{uuid.uuid4().hex[:12]}"
    _pg_admin(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def new_database(kind: str, directory: Path, *, migrate: bool = True) -> Iterator[str]:
    """The URL of a new database of ``kind``: ``postgresql`` (:func:`new_pg_database`) or
    ``sqlite`` (a file in ``directory``); migrated to head unless ``migrate`` is false."""
    with contextlib.ExitStack() as stack:
        if kind == "sqlite":
            url = f"sqlite:///{directory / 'omniqueue.db'}"
        else:
            url = stack.enter_context(new_pg_database())
        if migrate:
            upgrade(url)
        yield url


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this session."""
    with new_pg_database() as url:
        yield url


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
def redis_pool() -> Iterator[RedisDbPool]:
    """The one source of Redis database indexes of this run (:class:`RedisDbPool`)."""
    pool = RedisDbPool(REDIS_BASE_URL)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def redis_db(redis_pool: RedisDbPool) -> Iterator[int]:
    """A Redis database index of this module's own, empty (a module that needs a second
    one takes it with ``redis_pool.leased()``)."""
    with redis_pool.leased() as db:
        yield db


@pytest.fixture(scope="session")
def redis_url(redis_pool: RedisDbPool) -> Iterator[str]:
    """The URL of the session-wide :func:`stack`'s Redis database."""
    with redis_pool.leased() as db:
        yield redis_pool.url(db)


def service_settings(
    database_url: str, s3: EmbeddedS3, *, redis_db: int, **groups: Any
) -> Settings:
    """Settings for in-process code on the test services: ``database_url``, Redis index
    ``redis_db``, the shared S3 server; auth off and no ``.env`` unless ``groups`` say."""
    return Settings(  # type: ignore[call-arg]
        database={"url": database_url},
        redis={"url": f"{REDIS_BASE_URL}/{redis_db}"},
        s3=s3_settings(s3),
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
    database: str = "postgresql",
) -> Iterator[_S]:
    """A deployment of its own: a fresh database (PostgreSQL unless ``database`` is
    ``sqlite``), its own Redis index (so no other test's worker takes its jobs), auth off
    unless asked, on the shared S3 server."""
    redis_url = f"{REDIS_BASE_URL}/{redis_db}"
    with new_database(database, work) as url:
        redis.Redis.from_url(redis_url).flushdb()
        st = cls(
            work=work, database_url=url, redis_url=redis_url, s3=s3, auth=auth, extra_env=extra_env
        )
        try:
            yield st
        finally:
            st.stop(graceful=False)  # thrown away: its database dropped, its Redis flushed
            redis.Redis.from_url(redis_url).flushdb()


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
    database: str = "postgresql",
) -> Iterator[Stack]:
    """:func:`isolated_stack` in a fresh temporary directory, started with ``workers``
    job workers."""
    work = Path(tmp_path_factory.mktemp(name))
    with isolated_stack(
        work, s3, redis_db=redis_db, extra_env=extra_env or {}, auth=auth, database=database
    ) as st:
        st.start(workers=workers)
        yield st


@pytest.fixture(scope="module")
def astack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[AudioStack]:
    """An audio module's own stack (audio_stack.py): one worker, API keys required, no
    failpoints. A module that uses it makes it its ``stack``."""
    with isolated_stack(
        module_dir, s3_server, redis_db=redis_db, extra_env={}, cls=AudioStack, auth="required"
    ) as st:
        st.set_failpoints({})
        st.start(workers=1)
        yield st


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A migrated database, once on SQLite and once on a fresh PostgreSQL database."""
    with new_database(request.param, tmp_path) as url:
        eng = make_engine(DatabaseSettings(url=url))
        try:
            yield eng
        finally:
            eng.dispose()


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: EmbeddedS3, pg_url: str, redis_url: str
) -> Iterator[Stack]:
    """API + one worker on PostgreSQL, Redis and SeaweedFS, auth required; the worker logs
    each video's raw-frame SHA-256 (x264's output under load varies, its input not)."""
    upgrade(pg_url)
    work = tmp_path_factory.mktemp("stack")
    st = Stack(
        work=Path(work),
        database_url=pg_url,
        redis_url=redis_url,
        s3=s3_server,
        auth="required",
        extra_env={"OMNIQ_WORKER__LOG_FRAME_DIGESTS": "true"},
    )
    st.start(workers=1)
    try:
        yield st
    finally:
        st.stop(graceful=False)


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    """An API key of ``stack`` (a module's own stack where it overrides ``stack``)."""
    return stack.create_key("alice")


@pytest.fixture(scope="module")
def client(stack: Stack, key: str) -> Iterator[httpx.Client]:
    """An HTTP client of ``stack`` that sends ``key``."""
    with stack.client(key) as c:
        yield c
