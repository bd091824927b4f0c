"""A fixed pool of threads for the request path's blocking calls (database reads and
writes, broker publishes), awaited from the event loop.

Starlette's ``run_in_threadpool`` (anyio's ``to_thread``) wakes its threads through a
``queue.Queue`` (a Python condition variable) and builds cancel scopes per call;
``loop.run_in_executor`` builds a ``concurrent.futures.Future`` (a condition variable
again) per call. Under 50 concurrent status reads the hop itself was the largest cost
left in a read (docs/PERFORMANCE.md). Here a call is one ``SimpleQueue.put`` (C, no
condition variable) and its result comes back through ``call_soon_threadsafe`` into a
plain asyncio future.

Cancelling the caller does not stop the call: it finishes on its thread and its result is
dropped, as with anyio's and the executor's.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Call = tuple[
    asyncio.AbstractEventLoop,
    "asyncio.Future[Any]",
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
]


class BlockingPool:
    def __init__(self, threads: int, name: str = "blocking") -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on one of the pool's threads."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, future, fn, args, kwargs))
        return await future

    def shutdown(self) -> None:
        """Let every thread finish its current call and exit (calls still queued run
        first); does not wait."""
        for _ in self._threads:
            self._calls.put(None)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            loop, future, fn, args, kwargs = call
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, whatever it is
                _deliver(loop, _set_exception, future, exc)
            else:
                _deliver(loop, _set_result, future, result)
            del call, future, fn, args, kwargs  # no reference kept while idle


def _deliver(loop: asyncio.AbstractEventLoop, how: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for the result
        loop.call_soon_threadsafe(how, *args)


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # cancelled by its caller
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
