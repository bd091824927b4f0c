"""``WS /v1/realtime/video``: a thin shell that authenticates the socket and hands it to a
:class:`~api.realtime.world_session.WorldSession` (the asyncio shell around the sans-I/O
``WorldSessionProtocol``, joined to the worker through the shared relay,
``api/realtime/relay.py``). Losing Redis while placing the session or sending a command ends
it with ``error broker_error`` and close 1011, never a bare dropped socket. A socket that
drops without a close handshake leaves a streaming session resumable on any replica
(``session.resume``, ``api/realtime/world_resume.py``); a clean close ends it.
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from api.deps import accept_websocket
from api.inputs import reference_from_url
from api.metrics import REALTIME_SESSIONS
from api.realtime.broker import BROKER_ERRORS
from api.realtime.world_session import WorldSession
from api.state import AppState
from models.errors import RateLimited
from models.realtime_video import ErrorEvent

router = APIRouter(tags=["realtime"])


def _refusal(error: RateLimited) -> str:
    """This endpoint's ``error`` event of a session refused by a quota."""
    return ErrorEvent(message=error.message, code=error.code, param=error.param).to_json()


@router.websocket("/v1/realtime/video")
async def realtime_video(websocket: WebSocket) -> None:
    async with accept_websocket(websocket, _refusal) as accepted:
        if accepted is not None:
            await _serve(websocket, *accepted)


async def _serve(websocket: WebSocket, state: AppState, owner: str) -> None:
    specs = [s for s in state.specs.values() if s.streaming and s.modality == "video"]

    def fetch_reference(url: str, width: int, height: int) -> bytes:
        return reference_from_url(url, width, height, state.settings, "image_reference")

    session = WorldSession(websocket, state, owner, specs, fetch_reference)
    disconnected = dropped = False
    try:
        with REALTIME_SESSIONS.labels("video").track_inprogress():
            await session.run()
    except WebSocketDisconnect as exc:
        # A socket that went away without a close frame (a lost network, a killed
        # replica) is kept for a resume: uvicorn reports it as 1006 or, for a connection
        # aborted mid-send, 1005 ("no status", also what a close frame without a code
        # gives: such a close is kept too). Any close frame with a code ends the session.
        disconnected, dropped = True, exc.code in (1005, 1006)
    except BROKER_ERRORS:  # placing the session or sending a command
        await session.broker_lost()
    finally:
        await session.close(disconnected, dropped)
