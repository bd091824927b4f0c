"""Live job events: ``GET /v1/videos/{id}/events`` (SSE) and ``WS /v1/videos/{id}/stream``.

Both follow the job's Redis Stream from a given id: any number of watchers, a late one
gets the retained history first, and ``Last-Event-ID`` (or ``?last_event_id=``) resumes
exactly after the last event seen. The stream ends with ``done`` (see
:mod:`api.job_stream`, shared with audio jobs).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentOwner, VideosDep, websocket_owner
from api.job_stream import follow, sse, wire
from api.state import AppState
from api.videos_service import VideoService
from models.errors import OmniqueueError

router = APIRouter(prefix="/v1/videos", tags=["videos"])


@router.get("/{video_id}/events")
async def video_events(
    video_id: str,
    videos: VideosDep,
    owner: CurrentOwner,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id_q: Annotated[str | None, Query(alias="last_event_id")] = None,
) -> StreamingResponse:
    await run_in_threadpool(videos.get_job, video_id, owner)  # 404 for others' jobs
    after = last_event_id or last_event_id_q or "0-0"

    async def body() -> AsyncIterator[str]:
        async for entry in follow(videos.state, videos, video_id, owner, after):
            yield sse(entry)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


@router.websocket("/{video_id}/stream")
async def video_stream(websocket: WebSocket, video_id: str, last_event_id: str = "0-0") -> None:
    state: AppState = websocket.state.app
    videos = VideoService(state)
    owner, subprotocol = await websocket_owner(websocket, state)
    if owner is None:
        await websocket.close(code=1008, reason="invalid or missing API key")
        return
    try:
        await run_in_threadpool(videos.get_job, video_id, owner)
    except OmniqueueError as exc:
        await websocket.close(code=1008, reason=exc.message[:120])
        return
    await websocket.accept(subprotocol=subprotocol)
    try:
        async for entry in follow(state, videos, video_id, owner, last_event_id):
            if entry is None:
                continue
            message = wire(entry)
            if entry.data is not None:
                message["byte_length"] = len(entry.data)
            await websocket.send_text(json.dumps(message))
            if entry.data is not None:
                await websocket.send_bytes(entry.data)
        await websocket.close(code=1000)
    except WebSocketDisconnect:
        return
