"""HTTP/1.0 keep-alive on ``omniqueue api``'s protocol (``api.http_deadlines``), on a real
uvicorn server and raw sockets: a client that asks for it (ApacheBench ``-k``, some proxies)
keeps its connection when the response has a length; otherwise the connection closes, as
HTTP/1.0 requires."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from api.http_deadlines import deadline_protocol
from tests.unit.uvicorn_thread import serving


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    path = scope["path"]
    if path == "/stream":  # no length: only the end of the connection delimits it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part1", "more_body": True})
        await send({"type": "http.response.body", "body": b"part2"})
        return
    headers = [(b"content-length", b"5")]
    if path == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serving(app, deadline_protocol(5, 5)) as port:
        yield port


def _request(sock: socket.socket, path: str, keep_alive: bool) -> None:
    extra = b"Connection: Keep-Alive\r\n" if keep_alive else b""
    sock.sendall(b"GET %s HTTP/1.0\r\nHost: x\r\n%s\r\n" % (path.encode(), extra))


def _response(sock: socket.socket) -> tuple[dict[str, str], bytes]:
    """Headers and body of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "connection closed before the headers"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += sock.recv(4096)
    return headers, body


def _until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_http10_client_asking_for_keep_alive_keeps_its_connection(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for _ in range(3):  # three requests, one connection
            _request(sock, "/fixed", keep_alive=True)
            headers, body = _response(sock)
            assert headers["connection"] == "keep-alive"
            assert body == b"hello"


def test_http10_client_without_keep_alive_is_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        _request(sock, "/fixed", keep_alive=False)
        raw = _until_closed(sock)  # returns only because the server closed
    assert raw.endswith(b"hello")
    assert b"connection: close" in raw.lower()


@pytest.mark.parametrize("path", ["/stream", "/close"])
def test_http10_keep_alive_is_not_kept_without_a_length_or_when_the_app_closes(
    port: int, path: str
) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        _request(sock, path, keep_alive=True)
        raw = _until_closed(sock)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"connection: keep-alive" not in head.lower()
    assert b"part1" in body or body == b"hello"
