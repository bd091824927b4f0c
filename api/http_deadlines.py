"""Deadlines for receiving a request, on uvicorn's httptools and h11 protocols.

uvicorn bounds only the idle time between keep-alive requests; a client that opens a
connection and sends part of the headers, or announces a body and sends part of it, holds
the connection (and, for the body, a request task) forever. :func:`deadline_protocol`
gives a protocol class that arms one timer per connection:

- headers: from the connection's first byte (or its opening) until the request line and
  headers are complete, at most ``header_timeout_s``;
- body: from then until the body is complete, at most ``body_timeout_s``.

When a timer fires before a response started, the client gets ``408 Request Timeout``
and the connection is closed (an application still reading the body sees a disconnect).
A WebSocket upgrade or a request whose body is complete has no timer: how long the
application takes to answer is not the client's doing.

Two variants: on uvicorn's ``httptools`` protocol (the default where ``httptools`` is
installed, as it is with omniqueue: a C parser) and on its ``h11`` protocol.

The ``httptools`` variant also keeps HTTP/1.0 connections alive when the client asks
(``Connection: keep-alive``, as ApacheBench's ``-k``, some proxies and health checkers
send) and the response has a ``Content-Length``: it answers ``Connection: keep-alive``
(RFC 9112 §9.3 / RFC 1945 practice). uvicorn closes every HTTP/1.0 connection after one
response, so such a client paid a TCP accept and close per request. A response without a
length (a stream) still ends by closing, as HTTP/1.0 requires.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is the fallback
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

_TIMEOUT_BODY = (
    b'{"error":{"message":"the request was not received in time",'
    b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}'
)
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class _Deadlines:
    """The timer both variants share: one receive deadline per connection at a time."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 120.0
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    client: Any
    _receive_timer: asyncio.TimerHandle | None = None
    _receiving: str | None = None  # "headers", "body" or None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self, phase: str) -> None:
        if self._receiving == phase:
            return
        self._disarm()
        delay = self.header_timeout_s if phase == "headers" else self.body_timeout_s
        self._receiving = phase
        self._receive_timer = self.loop.call_later(delay, self._expired, phase)

    def _disarm(self) -> None:
        if self._receive_timer is not None:
            self._receive_timer.cancel()
        self._receive_timer = None
        self._receiving = None

    def _expired(self, phase: str) -> None:
        self._receive_timer = None
        self._receiving = None
        if self.transport.is_closing():
            return
        log.debug("%s of a request not received in time from %s; closing", phase, self.client)
        cycle = self.cycle
        if phase == "headers" or cycle is None:  # no request yet: nobody else will answer
            self.transport.write(_REQUEST_TIMEOUT)
        elif not cycle.response_started:  # the application still awaits the body
            cycle.disconnected = True  # its late answer goes nowhere
            cycle.message_event.set()
            self.transport.write(_REQUEST_TIMEOUT)
        # else it answered already (say 401 before reading the body): only close
        self.transport.close()


class DeadlineH11Protocol(_Deadlines, H11Protocol):
    """:class:`H11Protocol` with receive deadlines (see the module docstring)."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()

    def _follow_state(self) -> None:
        """Move the timer along with what the client still has to send."""
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            self._disarm()  # closed, or upgraded to a WebSocket
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm("body")
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm("headers")  # part of the next request is here
        elif state is not h11.IDLE or self._receiving == "body":
            self._disarm()


if HttpToolsProtocol is not None:

    class DeadlineHttpToolsProtocol(_Deadlines, HttpToolsProtocol):
        """:class:`HttpToolsProtocol` with receive deadlines (see the module docstring).
        The parser's callbacks note what the client still has to send (a request's first
        byte: its headers; complete headers: the body; a complete body or an upgrade:
        nothing), and the timer follows once a chunk has been parsed, so a request that
        arrives whole (most of them, on keep-alive connections) arms and cancels no timer
        at all; the headers deadline of a new connection starts when it opens."""

        _want: str | None = None

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                self._disarm()  # closed, or upgraded to a WebSocket
            elif self._want is None:
                self._disarm()
            else:
                self._arm(self._want)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._want = "headers"

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            if self.parser.should_upgrade():
                self._want = None  # a WebSocket: its own protocol takes over
                return
            self._want = "body"
            if self.scope.get("http_version") == "1.0" and self.parser.should_keep_alive():
                _keep_http10_alive(self.cycle)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._want = None


def _keep_http10_alive(cycle: Any) -> None:
    """Let ``cycle`` (an HTTP/1.0 request that asked for keep-alive) keep its connection
    if its response carries a ``Content-Length``. Set before the request's task first runs
    (uvicorn starts it on the next loop turn), so every ``send`` goes through here."""
    send = cycle.send

    async def keep_alive_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            names = {name.lower() for name, _ in headers}
            if b"content-length" in names and b"connection" not in names:
                cycle.keep_alive = True
                headers.append((b"connection", b"keep-alive"))
                message = {**message, "headers": headers}
        await send(message)

    cycle.send = keep_alive_send


def deadline_protocol(header_timeout_s: float, body_timeout_s: float) -> type[Any]:
    """A protocol class with these limits (uvicorn's ``http=``): on httptools where it is
    installed, else on h11."""
    base: type[Any] = (
        DeadlineH11Protocol if HttpToolsProtocol is None else DeadlineHttpToolsProtocol
    )
    return h11_deadline_protocol(header_timeout_s, body_timeout_s, base)


def h11_deadline_protocol(
    header_timeout_s: float, body_timeout_s: float, base: type[Any] | None = None
) -> type[Any]:
    """A subclass of ``base`` (:class:`DeadlineH11Protocol` unless given) with these limits."""
    base = base or DeadlineH11Protocol
    return type(
        base.__name__,
        (base,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )
