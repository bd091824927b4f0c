"""Receive deadlines of ``api.http_deadlines`` on a real uvicorn server and real sockets
(a tiny ASGI app instead of omniqueue's, so each edge is reached exactly)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from api.http_deadlines import DeadlineHttpToolsProtocol, deadline_protocol, h11_deadline_protocol
from tests.unit.uvicorn_thread import serving

HEADER_S = 0.6
BODY_S = 0.8
SEEN: dict[str, Any] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        await asyncio.sleep(BODY_S + HEADER_S + 0.5)  # longer than both limits
        await send({"type": "websocket.send", "text": "still here"})
        await send({"type": "websocket.close", "code": 1000})
        return
    if scope["path"] == "/early":  # answers before reading the body (like a 401)
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            SEEN["disconnect"] = True
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await asyncio.sleep(HEADER_S + BODY_S)  # a slow answer is not the client's fault
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"got %d" % len(body)})


@pytest.fixture(scope="module", params=["httptools", "h11"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    if request.param == "httptools":
        http = deadline_protocol(HEADER_S, BODY_S)  # what omniqueue api runs
        assert issubclass(http, DeadlineHttpToolsProtocol)
    else:
        http = h11_deadline_protocol(HEADER_S, BODY_S)
    with serving(app, http) as port:
        yield port


def _drain(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything until the server closes, and how long that took."""
    start = time.monotonic()
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data, time.monotonic() - start


def test_partial_headers_get_408_and_are_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        data, took = _drain(sock, 5)
    assert data.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in data
    assert took < HEADER_S + 1.0


def test_a_silent_connection_is_closed_after_the_header_limit(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        data, took = _drain(sock, 5)
    assert data.startswith(b"HTTP/1.1 408 ")
    assert took < HEADER_S + 1.0


def test_partial_body_gets_408_and_the_app_sees_a_disconnect(port: int) -> None:
    SEEN.clear()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        data, took = _drain(sock, 5)
    assert data.startswith(b"HTTP/1.1 408 ")
    assert took < BODY_S + 1.0
    time.sleep(0.1)
    assert SEEN.get("disconnect") is True


def test_after_an_early_answer_a_slow_body_is_only_closed(port: int) -> None:
    """The app answered already: no second (408) response on the wire, just a close."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        data, _ = _drain(sock, 5)
    assert data.startswith(b"HTTP/1.1 401 ")
    assert b"408" not in data


def test_a_slow_answer_and_keep_alive_are_not_cut(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        for _ in range(2):  # two requests on one connection, each answered slowly
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")
            time.sleep(BODY_S / 2)
            sock.sendall(b"abcd")
            data = b""
            # up to the chunked body's last chunk, so the next answer starts clean
            while not (b"got 4" in data and data.endswith(b"0\r\n\r\n")):
                chunk = sock.recv(4096)
                assert chunk, data
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 ")


def test_websockets_outlive_the_limits(port: int) -> None:
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/ws") as ws:
        assert ws.recv(timeout=5) == "still here"
