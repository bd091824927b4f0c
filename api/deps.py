"""FastAPI dependencies: typed access to the lifespan state and the caller's identity."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import Depends, Header, Request, WebSocket

from api.state import AppState
from models.db import ApiKey
from models.errors import AuthenticationError, RateLimited
from storage.constants import LOCAL_OWNER

# The dependencies below are ``async def`` on purpose: FastAPI runs a plain ``def``
# dependency in the thread pool, and two such hops per request were a quarter of the API
# process's CPU time under concurrent status reads (thread wake-ups under the GIL). They
# read the state from the request rather than depend on ``get_state``: each level of
# FastAPI's dependency solving (a sub-dependency is solved again before its cached value
# is used) was ~5% of a status read.


async def get_state(request: Request) -> AppState:
    state: AppState = request.state.app
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def current_owner(request: Request) -> str:
    """The id of the API key making the request (``local`` while auth is off)."""
    return await authenticate(request, request.state.app)


async def authenticate(request: Request, state: AppState) -> str:
    """The id of the API key of ``request``'s bearer header; ``local`` while auth is off;
    :class:`AuthenticationError` (401) without a live key."""
    key = await authenticate_key(request, state)
    return LOCAL_OWNER if key is None else key.id


async def authenticate_key(request: Request, state: AppState) -> ApiKey | None:
    """The live API key of ``request``'s bearer header (with its quotas); None while auth
    is off; :class:`AuthenticationError` (401) without a live key."""
    if state.settings.auth == "off":
        return None
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError(
            "missing API key: send 'Authorization: Bearer <key>' "
            "(create one with 'omniqueue keys create')"
        )
    key = await state.blocking(state.keys.verify, token.strip())
    if key is None:
        raise AuthenticationError("invalid or revoked API key")
    return key


CurrentOwner = Annotated[str, Depends(current_owner)]

# The ``Idempotency-Key`` header of every create route.
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]


INSECURE_KEY_PROTOCOL = "openai-insecure-api-key."


async def websocket_owner(websocket: WebSocket, state: AppState) -> tuple[str | None, str | None]:
    """The caller of a WebSocket and the subprotocol to accept: a bearer header, or the
    ``openai-insecure-api-key.<key>`` subprotocol browsers use (OpenAI Realtime)."""
    owner, _, chosen = await _websocket_key(websocket, state)
    return owner, chosen


async def _websocket_key(
    websocket: WebSocket, state: AppState
) -> tuple[str | None, ApiKey | None, str | None]:
    """:func:`websocket_owner` and the caller's key row (None while auth is off)."""
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
    chosen = next((p for p in offered if p.startswith(INSECURE_KEY_PROTOCOL)), None)
    if state.settings.auth == "off":
        return LOCAL_OWNER, None, chosen
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    secret = token.strip() if scheme.lower() == "bearer" else ""
    if not secret and chosen:
        secret = chosen[len(INSECURE_KEY_PROTOCOL) :]
    if not secret:
        return None, None, None
    key = await state.blocking(state.keys.verify, secret)
    return (key.id if key else None), key, chosen


@contextlib.asynccontextmanager
async def accept_websocket(
    websocket: WebSocket, refusal: Callable[[RateLimited], str]
) -> AsyncIterator[tuple[AppState, str] | None]:
    """Authenticate and accept a realtime WebSocket, holding one of its key's session
    places (``max_sessions``, :meth:`api.quotas.Quotas.session_lease`) for the block: the
    app state and the caller, or None once the socket was closed: 1008 without a valid
    key; over the key's session limit, the ``refusal(error)`` event (the endpoint's own
    ``error`` event, ``code: rate_limit_exceeded``) and 1013 (try again later)."""
    state: AppState = websocket.state.app
    owner, key, subprotocol = await _websocket_key(websocket, state)
    if owner is None:
        await websocket.close(code=1008, reason="invalid or missing API key")
        yield None
        return
    await websocket.accept(subprotocol=subprotocol)
    limit = state.quotas.limits_for(key).max_sessions
    async with state.quotas.session_lease(owner, limit) as admitted:
        if not admitted:
            error = RateLimited(
                f"this key has {limit} realtime sessions open, its limit (max_sessions); "
                "end one or try again later",
                param="max_sessions",
                headers={},
            )
            await websocket.send_text(refusal(error))
            await websocket.close(code=1013, reason="max_sessions reached")
            yield None
            return
        yield state, owner
