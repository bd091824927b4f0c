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


def test_a_lease_outlives_its_ttl_while_the_run_lives(redis_pool: RedisDbPool) -> None:
    # short leases for these two pools only: the run's own pool keeps its TTL
    pool, other = RedisDbPool(REDIS_BASE_URL, ttl_ms=600), RedisDbPool(REDIS_BASE_URL, ttl_ms=600)
    admin = redis.Redis.from_url(f"{REDIS_BASE_URL}/0")
    try:
        with redis_pool.leased() as runs, pool.leased() as mine:
            time.sleep(1.5)  # more than twice the TTL
            assert admin.pttl(f"omniq-test:redis-db:{mine}") > 0
            with other.leased() as theirs:
                assert theirs not in (mine, runs)
            # the run's own lease was never shortened to these pools' TTL
            assert admin.pttl(f"omniq-test:redis-db:{runs}") > 10_000
        assert admin.get(f"omniq-test:redis-db:{mine}") is None  # released
    finally:
        pool.close()
        other.close()
        admin.close()
