"""Deadlines for receiving a request: uvicorn's h11 protocol with a header and a body timer.

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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

_TIMEOUT_BODY = (
    b'{"error":{"message":"the request was not received in time",'
    b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}'
)
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class DeadlineH11Protocol(H11Protocol):
    """:class:`H11Protocol` with receive deadlines (see the module docstring)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 120.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._receive_timer: asyncio.TimerHandle | None = None
        self._receiving: str | None = None  # "headers", "body" or None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
        if phase == "headers":  # no request yet: nobody else will answer
            self.transport.write(_REQUEST_TIMEOUT)
        elif not self.cycle.response_started:  # the application still awaits the body
            self.cycle.disconnected = True  # its late answer goes nowhere
            self.cycle.message_event.set()
            self.transport.write(_REQUEST_TIMEOUT)
        # else it answered already (say 401 before reading the body): only close
        self.transport.close()


def deadline_protocol(header_timeout_s: float, body_timeout_s: float) -> type[H11Protocol]:
    """A :class:`DeadlineH11Protocol` class with these limits (uvicorn's ``http=``)."""
    return type(
        "DeadlineH11Protocol",
        (DeadlineH11Protocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )
