"""FastAPI dependencies: typed access to the lifespan state and the caller's identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, WebSocket

from api.audio_service import AudioService
from api.state import AppState
from api.videos_service import VideoService
from models.errors import AuthenticationError
from storage.constants import LOCAL_OWNER

# The dependencies below are ``async def`` on purpose: FastAPI runs a plain ``def``
# dependency in the thread pool, and two such hops per request were a quarter of the API
# process's CPU time under concurrent status reads (thread wake-ups under the GIL).


async def get_state(request: Request) -> AppState:
    state: AppState = request.state.app
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def get_videos(state: StateDep) -> VideoService:
    return VideoService(state)


VideosDep = Annotated[VideoService, Depends(get_videos)]


async def get_audio(state: StateDep) -> AudioService:
    return AudioService(state)


AudioDep = Annotated[AudioService, Depends(get_audio)]


async def current_owner(request: Request, state: StateDep) -> str:
    """The id of the API key making the request (``local`` while auth is off)."""
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
