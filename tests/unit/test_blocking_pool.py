"""api.blocking.BlockingPool: results, exceptions, cancellation and concurrency."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from api.blocking import BlockingPool


def test_runs_the_call_on_a_pool_thread_and_returns_its_result() -> None:
    pool = BlockingPool(2, name="t")

    async def main() -> tuple[str, int]:
        name = await pool.run(lambda: threading.current_thread().name)
        return name, await pool.run(pow, 2, 10)

    try:
        name, value = asyncio.run(main())
    finally:
        pool.shutdown()
    assert name.startswith("t-") and name != threading.current_thread().name
    assert value == 1024


def test_an_exception_reaches_the_caller_as_itself() -> None:
    pool = BlockingPool(1)

    def fail() -> None:
        raise KeyError("missing")

    async def main() -> None:
        await pool.run(fail)

    try:
        with pytest.raises(KeyError, match="missing"):
            asyncio.run(main())
    finally:
        pool.shutdown()


def test_threads_run_calls_in_parallel_up_to_the_pool_size() -> None:
    pool = BlockingPool(4)
    running = 0
    peak = 0
    lock = threading.Lock()

    def call() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    async def main() -> None:
        await asyncio.gather(*(pool.run(call) for _ in range(12)))

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    assert peak == 4


def test_a_cancelled_caller_leaves_the_call_to_finish_and_the_pool_usable() -> None:
    pool = BlockingPool(1)
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.2)
        finished.set()
        return "late"

    async def main() -> str:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await pool.run(slow)
        return await pool.run(str, 7)  # queued behind slow(), then served

    try:
        assert asyncio.run(main()) == "7"
    finally:
        pool.shutdown()
    assert finished.is_set()


def test_shutdown_ends_the_threads() -> None:
    pool = BlockingPool(3, name="ending")
    pool.shutdown()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("ending-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "pool threads still alive"
        time.sleep(0.01)
