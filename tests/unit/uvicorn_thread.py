"""A real uvicorn server on a thread, for tests of the HTTP protocol layer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from workers.runtime.processes import free_port


@contextmanager
def serving(app: Any, http: type[Any]) -> Iterator[int]:
    """Serve ``app`` with protocol class ``http`` on a free loopback port; yields the port.
    No lifespan events: the test apps only answer ``http`` and ``websocket`` scopes."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=http, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
