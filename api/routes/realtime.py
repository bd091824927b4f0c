"""``WS /v1/realtime`` (OpenAI Realtime GA) and its duplex alias ``/v1/duplex``.

A thin shell: authenticate, pick the model, then read client frames into a
:class:`~api.realtime.voice_session.VoiceSession`, which joins the sans-I/O protocol and the
worker (through the shared relay, ``api/realtime/relay.py``). Admission (no worker slot
within the admission timeout → ``resource_exhausted``), liveness (a silent worker →
``worker_lost``) and the broker (a failed Redis command → ``error broker_error``, close
1011) are judged there, as for world sessions.

Duplex sessions outlive their socket for ``realtime.resume_grace_s``: ``session.resume``
as the first event on a new socket re-attaches it (the protocol asks for it, the
session's shell does it), on any API replica (their state is in Redis,
``api/realtime/voice_state.py``; ``app_state.voice_sessions`` caches the ones this process
holds).
"""

from __future__ import annotations

import asyncio
import secrets

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from api.deps import accept_websocket
from api.metrics import REALTIME_SESSIONS
from api.realtime.voice_session import VoiceSession
from api.state import AppState
from models.errors import RateLimited
from models.realtime import ErrorEvent, RealtimeError

router = APIRouter(tags=["realtime"])


def _pick_model(state: AppState, requested: str | None) -> tuple[str | None, str]:
    """The session's voice model, or None and why not (for the ``error`` event)."""
    voice = [n for n, s in state.specs.items() if s.streaming and s.modality == "audio"]
    if not voice:
        return None, (
            "this server serves no realtime voice model (a streaming audio model, such as "
            "reference/voice), so /v1/realtime has nothing to run"
        )
    if requested and requested not in voice:
        served = ", ".join(voice)
        return None, f"model {requested!r} does not serve realtime audio sessions ({served} do)"
    return requested or voice[0], ""


def _refusal(error: RateLimited) -> str:
    """The OpenAI Realtime ``error`` event of a session refused by a quota."""
    detail = RealtimeError(
        type=error.type, code=error.code, message=error.message, param=error.param
    )
    return ErrorEvent(event_id="event_" + secrets.token_hex(10), error=detail).model_dump_json()


async def _serve(websocket: WebSocket, duplex: bool) -> None:
    async with accept_websocket(websocket, _refusal) as accepted:
        if accepted is not None:
            await _serve_accepted(websocket, *accepted, duplex)


async def _serve_accepted(websocket: WebSocket, state: AppState, owner: str, duplex: bool) -> None:
    requested = websocket.query_params.get("model")
    model, why_not = _pick_model(state, requested)
    if model is None:
        detail = RealtimeError(code="model_not_found", message=why_not, param="model")
        event = ErrorEvent(event_id="event_" + secrets.token_hex(10), error=detail)
        await websocket.send_text(event.model_dump_json(exclude_none=True))
        await websocket.close(code=1008)
        return
    session = VoiceSession(state, owner, model, duplex)
    session.attach(websocket)
    state.voice_sessions[session.id] = session
    session.tasks.append(asyncio.create_task(session.clock()))
    await session.flush()  # session.created
    if not duplex:
        await session.place()  # placed now, so the first response does not wait for it
        await session.flush()  # the broker_error when it could not be placed
    try:
        while not (session.ended_event.is_set() or session.protocol.close_expected()):
            # No timeout here: a timer per message costs the event loop dearly at hundreds
            # of appends a second; the protocol's clocks run in the session's clock task.
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            text = message.get("text")
            if text is not None:  # binary frames carry nothing in this protocol
                # a session.resume opening the socket re-attaches another session to it
                session = await session.receive(text)
    except WebSocketDisconnect:
        pass
    finally:
        if session.ws is websocket:
            await session.disconnected()


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    duplex = websocket.query_params.get("duplex", "").lower() in ("1", "true", "yes")
    with REALTIME_SESSIONS.labels("voice").track_inprogress():
        await _serve(websocket, duplex)


@router.websocket("/v1/duplex")
async def duplex(websocket: WebSocket) -> None:
    with REALTIME_SESSIONS.labels("voice").track_inprogress():
        await _serve(websocket, True)
