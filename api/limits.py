"""An ASGI guard that refuses request bodies above a byte cap while they stream in."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response
from models.errors import PayloadTooLarge


class BodySizeLimit:
    """413 once a body passes ``max_bytes``: at once by Content-Length, else while counting
    (the :class:`PayloadTooLarge` raised from ``receive`` reaches the error handlers)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                resp = error_response(
                    413,
                    f"request body is larger than {self.max_bytes} bytes",
                    "invalid_request_error",
                    code="payload_too_large",
                )
                await resp(scope, receive, send)
                return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLarge(f"request body is larger than {self.max_bytes} bytes")
            return message

        await self.app(scope, counting_receive, send)
