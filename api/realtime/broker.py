"""The realtime sessions' view of the broker (Redis/Valkey): which exceptions mean it is
gone, and a bound on every call so a stalled one (SIGSTOP, a hung network) ends the
session with ``broker_error`` instead of hanging it. The API's asyncio Redis client has
no per-command socket timeout (``api/state.py`` says why), so the bound is set here, per
call, on the few bus calls a session makes a second."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from kombu.exceptions import OperationalError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Redis commands (the bus) and Celery's publish of the session (the queue)
BROKER_ERRORS = (RedisError, OperationalError)
# A healthy broker answers an XADD or an XREAD BLOCK 250 in well under this, even on a
# loaded host; a stalled one is declared gone after it.
BROKER_TIMEOUT_S = 5.0

T = TypeVar("T")


async def bounded(call: Awaitable[T], timeout_s: float = BROKER_TIMEOUT_S) -> T:
    """``await call``, or a ``redis.exceptions.TimeoutError`` after ``timeout_s``.
    ``asyncio.timeout`` arms one timer handle and, unlike ``wait_for`` on Python 3.11,
    does not wrap the call in a new task: the relay reads through this many times a
    second per session."""
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except TimeoutError:
        raise RedisTimeoutError(f"the broker did not answer within {timeout_s:g} s") from None
