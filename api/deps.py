"""FastAPI dependencies: typed access to the lifespan state and the caller's identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from api.state import AppState
from api.videos_service import VideoService
from models.errors import AuthenticationError
from storage.constants import LOCAL_OWNER


def get_state(request: Request) -> AppState:
    state: AppState = request.state.app
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def get_videos(state: StateDep) -> VideoService:
    return VideoService(state)


VideosDep = Annotated[VideoService, Depends(get_videos)]


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
    key = await run_in_threadpool(state.keys.verify, token.strip())
    if key is None:
        raise AuthenticationError("invalid or revoked API key")
    return key.id


CurrentOwner = Annotated[str, Depends(current_owner)]
