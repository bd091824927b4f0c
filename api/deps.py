"""FastAPI dependencies: typed access to the lifespan state and the caller's identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request, WebSocket

from api.audio_service import AudioService
from api.state import AppState
from api.videos_service import VideoService
from models.errors import AuthenticationError
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


async def get_videos(request: Request) -> VideoService:
    return VideoService(request.state.app)


VideosDep = Annotated[VideoService, Depends(get_videos)]


async def get_audio(request: Request) -> AudioService:
    return AudioService(request.state.app)


AudioDep = Annotated[AudioService, Depends(get_audio)]


async def current_owner(request: Request) -> str:
    """The id of the API key making the request (``local`` while auth is off)."""
    return await authenticate(request, request.state.app)


async def authenticate(request: Request, state: AppState) -> str:
    """The id of the API key of ``request``'s bearer header; ``local`` while auth is off;
    :class:`AuthenticationError` (401) without a live key."""
    if state.settings.auth == "off":
        return LOCAL_OWNER
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
    return key.id


CurrentOwner = Annotated[str, Depends(current_owner)]

# The ``Idempotency-Key`` header of every create route.
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]


INSECURE_KEY_PROTOCOL = "openai-insecure-api-key."


async def websocket_owner(websocket: WebSocket, state: AppState) -> tuple[str | None, str | None]:
    """The caller of a WebSocket and the subprotocol to accept: a bearer header, or the
    ``openai-insecure-api-key.<key>`` subprotocol browsers use (OpenAI Realtime)."""
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
    chosen = next((p for p in offered if p.startswith(INSECURE_KEY_PROTOCOL)), None)
    if state.settings.auth == "off":
        return LOCAL_OWNER, chosen
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    secret = token.strip() if scheme.lower() == "bearer" else ""
    if not secret and chosen:
        secret = chosen[len(INSECURE_KEY_PROTOCOL) :]
    if not secret:
        return None, None
    key = await state.blocking(state.keys.verify, secret)
    return (key.id if key else None), chosen


async def accept_websocket(websocket: WebSocket) -> tuple[AppState, str] | None:
    """Authenticate and accept a realtime WebSocket: the app state and the caller, or
    None once a socket without a valid key was closed (1008)."""
    state: AppState = websocket.state.app
    owner, subprotocol = await websocket_owner(websocket, state)
    if owner is None:
        await websocket.close(code=1008, reason="invalid or missing API key")
        return None
    await websocket.accept(subprotocol=subprotocol)
    return state, owner
