"""A webhook receiver for tests and benchmarks: a real HTTP server on a free port, in a
thread, that records every request and answers by path:

* ``/ok…``: 200;
* ``/flaky…``: 503 to the first three requests of each ``webhook-id``, then 200;
* ``/reject…``: 400.

Receipts are verified by the caller with ``standardwebhooks`` (the receiver only keeps
the bytes and headers as they came).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workers.runtime.processes import free_port

FLAKY_FAILURES = 3


@dataclass(frozen=True)
class Receipt:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered
    at: float  # time.time() when it arrived

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


class Receiver:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.receipts: list[Receipt] = []
        self._seen: dict[str, int] = {}
        self._lock = threading.RLock()  # wait()'s predicate may call accepted()
        self._changed = threading.Condition(self._lock)
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _answer(self, path: str, webhook_id: str) -> int:
        with self._lock:
            self._seen[webhook_id] = self._seen.get(webhook_id, 0) + 1
            count = self._seen[webhook_id]
        if path.startswith("/flaky"):
            return 503 if count <= FLAKY_FAILURES else 200
        if path.startswith("/reject"):
            return 400
        return 200

    def _record(self, receipt: Receipt) -> None:
        with self._changed:
            self.receipts.append(receipt)
            self._changed.notify_all()

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver._answer(self.path, headers.get("webhook-id", ""))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()
                receiver._record(Receipt(self.path, headers, body, status, time.time()))

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait(self, until: Callable[[list[Receipt]], bool], timeout: float = 60) -> list[Receipt]:
        """The receipts once ``until(receipts)`` holds; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not until(self.receipts):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"receiver got {len(self.receipts)} requests")
                self._changed.wait(left)
            return list(self.receipts)

    def accepted(self, webhook_id: str) -> list[Receipt]:
        """The 2xx-answered receipts of one event."""
        with self._lock:
            return [r for r in self.receipts if r.webhook_id == webhook_id and r.status < 300]


@contextmanager
def running_receiver(port: int | None = None) -> Iterator[Receiver]:
    receiver = Receiver(port)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
