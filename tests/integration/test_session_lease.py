"""Worker leases on a real Redis (``workers/sessions/lease.py``, the API's look in
``storage/session_lease.py``): a lease lives while its worker renews it; it names the
connection that renews it, so a process that dies is seen gone at once, long before the
TTL could run out; a connection that drops while its worker lives is named again by the
next renew; and where the server refuses ``CLIENT``, both sides go by the TTL alone."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from storage import session_lease
from storage.constants import session_lease_key
from storage.session_lease import LeaseLook, parse_lease
from tests.integration.conftest import REDIS_BASE_URL, flushed_redis
from workers.sessions.lease import SessionLease

pytestmark = pytest.mark.integration

SESSION = "rtv_lease"
KEY = session_lease_key(SESSION, 2)


@pytest.fixture
def url(redis_db: int) -> Iterator[str]:
    with flushed_redis(f"{REDIS_BASE_URL}/{redis_db}"):
        yield f"{REDIS_BASE_URL}/{redis_db}"


def _held(url: str, key: str = KEY) -> tuple[bool, bool]:
    """The API's look at ``key``, on its own asyncio client: (held, CLIENT LIST refused)."""

    async def look() -> tuple[bool, bool]:
        client = redis.asyncio.Redis.from_url(url)
        try:
            lease = LeaseLook(client)
            return await lease.held(key), lease.refused
        finally:
            await client.aclose()

    return asyncio.run(look())


def test_a_lease_lives_as_long_as_its_holder(url: str) -> None:
    """Renewed by its thread past its TTL while the block runs; gone right after."""
    client = redis.Redis.from_url(url)
    with SessionLease(client, SESSION, 2, "w1", lease_s=0.3, every_s=1.0) as lease:
        value = client.get(KEY)
        assert value is not None and parse_lease(value) == ("w1", lease.client_id)
        assert lease.client_id is not None and lease.client_id != client.client_id()
        time.sleep(0.6)  # twice the TTL
        assert _held(url) == (True, False)
    assert not client.exists(KEY) and _held(url) == (False, False)
    with SessionLease(client, SESSION, 2, "w1", lease_s=0, every_s=1.0):
        assert not client.exists(KEY)  # no lease at all
    with SessionLease(client, SESSION, 2, "w1", lease_s=3, every_s=1.0, bind=False):
        assert client.get(KEY) == b"w1"  # OMNIQ_REALTIME__WORKER_LEASE_CONNECTION off


_HOLDER = """
import sys, time, redis
from workers.sessions.lease import SessionLease
with SessionLease(redis.Redis.from_url(sys.argv[1]), "rtv_lease", 2, "w1",
                  lease_s=30, every_s=1.0) as lease:
    print(lease.client_id, flush=True)
    time.sleep(120)
"""


def test_a_killed_holder_is_seen_gone_before_its_ttl_could_run_out(url: str) -> None:
    """SIGKILL closes the process's connections: the lease's client is gone at once, and
    the API sees the worker dead while the key still has most of its 30 s to live."""
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        client_id = int(holder.stdout.readline())
        assert _held(url) == (True, False)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 5  # the server reads the closed socket in its loop
        while client.client_list(client_id=[client_id]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _held(url) == (False, False)
        assert client.pttl(KEY) > 20_000  # its TTL had not run out: the connection told
    finally:
        holder.kill()
        holder.wait(10)


def test_a_lease_whose_connection_dropped_names_the_new_one(url: str) -> None:
    """A connection killed under a live worker: its next renew (every 0.1 s here) writes
    the id of the connection it made again, and the API's look finds it held."""
    client = redis.Redis.from_url(url)
    with SessionLease(client, SESSION, 2, "w1", lease_s=3, every_s=0.1) as lease:
        first = lease.client_id
        assert first is not None
        client.client_kill_filter(_id=str(first))
        deadline = time.monotonic() + 5
        while parse_lease(client.get(KEY) or b"")[1] == first and time.monotonic() < deadline:
            time.sleep(0.02)
        value = client.get(KEY)
        assert value is not None
        again = parse_lease(value)[1]
        assert again is not None and again != first and again == lease.client_id
        assert client.client_list(client_id=[again])  # the connection it names lives
        assert _held(url) == (True, False)


@pytest.fixture
def acl_user(url: str) -> Iterator[tuple[str, str]]:
    """A user that may do anything but ``CLIENT LIST`` (the API's) and one that may do
    nothing of ``CLIENT`` (a worker's): URLs of each."""
    admin = redis.Redis.from_url(url)
    names = [f"oq_lease_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    rules = ["-client|list", "-client"]
    for name, rule in zip(names, rules, strict=True):
        admin.acl_setuser(name, enabled=True, nopass=True, keys="~*", channels="&*")
        admin.execute_command("ACL", "SETUSER", name, "+@all", rule)
    db = url.rsplit("/", 1)[1]
    host = REDIS_BASE_URL.split("://", 1)[1]
    try:
        yield f"redis://{names[0]}@{host}/{db}", f"redis://{names[1]}@{host}/{db}"
    finally:
        for name in names:
            admin.acl_deluser(name)


def test_where_client_is_refused_the_ttl_alone_tells(
    url: str, acl_user: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    api_url, worker_url = acl_user
    client = redis.Redis.from_url(url)
    session_lease._say_refused.cache_clear()  # said once per process: this test's own
    with caplog.at_level(logging.INFO):
        with SessionLease(redis.Redis.from_url(worker_url), SESSION, 2, "w1",
                          lease_s=3, every_s=1.0) as lease:  # fmt: skip
            assert lease.client_id is None and client.get(KEY) == b"w1"
        assert "not bound to its connection" in caplog.text
        # a lease bound to a connection that is gone, looked at by an API whose user may
        # not list clients: held (its TTL runs), and the look stops asking
        client.set(KEY, "w1 client=999999999", px=3000)
        assert _held(api_url) == (True, True)
        assert "CLIENT LIST refused" in caplog.text
        client.delete(KEY)
        assert _held(api_url) == (False, False)  # a lease run out is still gone
