"""The pool of Redis database indexes (tests/integration/conftest.py): two test runs on
one Redis never hold the same index, and an index is empty when it is handed out."""

from __future__ import annotations

import time

import pytest
import redis

from tests.integration.conftest import REDIS_BASE_URL, RedisDbPool

pytestmark = pytest.mark.integration


def test_two_runs_on_one_redis_never_share_an_index(redis_pool: RedisDbPool) -> None:
    other = RedisDbPool(REDIS_BASE_URL)  # what a second run on this Redis makes
    try:
        with redis_pool.leased() as mine, other.leased() as theirs:
            assert mine != theirs
            with other.leased() as more:
                assert more not in (mine, theirs)
            redis.Redis.from_url(redis_pool.url(mine)).set("left", "behind")
        # released by both: each index can be leased again, by either run, and is empty
        with other.leased() as again:
            assert redis.Redis.from_url(other.url(again)).dbsize() == 0
    finally:
        other.close()


def test_a_lease_outlives_its_ttl_while_the_run_lives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RedisDbPool, "TTL_MS", 600)  # renewed every 0.2 s
    pool, other = RedisDbPool(REDIS_BASE_URL), RedisDbPool(REDIS_BASE_URL)
    admin = redis.Redis.from_url(f"{REDIS_BASE_URL}/0")
    try:
        with pool.leased() as mine:
            time.sleep(1.5)  # more than twice the TTL
            assert admin.pttl(f"omniq-test:redis-db:{mine}") > 0
            with other.leased() as theirs:
                assert theirs != mine
        assert admin.get(f"omniq-test:redis-db:{mine}") is None  # released
    finally:
        pool.close()
        other.close()
        admin.close()
