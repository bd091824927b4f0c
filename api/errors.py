"""HTTP mapping of the exception tree (see ``models/errors.py``): status + OpenAI error body."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from models.common import ErrorBody, ErrorDetail
from models.errors import (
    ErrorCode,
    OmniqueueError,
    RangeNotSatisfiable,
    RateLimited,
    ServiceUnavailable,
)

log = logging.getLogger(__name__)

# ``request.state`` attribute holding a create's ``x-ratelimit-*`` headers (api/quotas.py).
RATELIMIT_STATE = "ratelimit_headers"

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def broker_unavailable() -> ServiceUnavailable:
    """A request that needed Redis (the broker, a key's quota window) and did not get it
    within its bounds: 503 ``broker_error``."""
    return ServiceUnavailable("the job broker is unavailable", code=ErrorCode.BROKER_ERROR.value)


def error_response(
    status: int, message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


async def _omniqueue_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OmniqueueError)
    resp = error_response(exc.status_code, exc.message, exc.type, param=exc.param, code=exc.code)
    if isinstance(exc, RangeNotSatisfiable):  # RFC 9110 §15.5.17: say how long it is
        resp.headers["Content-Range"] = f"bytes */{exc.size}"
    # A create refused after its rate-limit hit still says where the key stands.
    headers = getattr(request.state, RATELIMIT_STATE, None)
    if headers:
        resp.headers.update(headers)
    if isinstance(exc, RateLimited):
        resp.headers.update(exc.headers)
    return resp


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    message = f"{param}: {first.get('msg', 'invalid value')}" if param else "invalid request"
    return error_response(422, message, "invalid_request_error", param=param, code="invalid_value")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    message = str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":  # no route (or static file) here
        message = _unknown_route(request)
    resp = error_response(exc.status_code, message, type_)
    if exc.headers:
        resp.headers.update(exc.headers)
    if exc.status_code == 405:
        resp.headers["Allow"] = ", ".join(allowed_methods(request))
    return resp


def _unknown_route(request: Request) -> str:
    """The 404 of a path no route serves: OpenAI's ``Invalid URL (METHOD /path)``, and
    where the routes are listed."""
    return (
        f"Invalid URL ({request.method} {request.url.path}): no such route. The API's routes "
        "are listed at /docs (OpenAPI: /openapi.json); the playground is at /."
    )


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path. Starlette's own 405 names only the
    first route that matched the path (``POST`` for ``PUT /v1/videos``, not ``GET, POST``)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    ]


async def _client_disconnect(_: Request, exc: Exception) -> Response:
    """The client left (or was closed for sending too slowly) while its body was read:
    nobody to answer, nothing to log."""
    return Response(status_code=499)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal server error", "server_error", code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OmniqueueError, _omniqueue_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_disconnect)
    app.add_exception_handler(Exception, _unexpected_error)
