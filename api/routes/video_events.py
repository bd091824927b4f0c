"""Live job events: ``GET /v1/videos/{id}/events`` (SSE) and ``WS /v1/videos/{id}/stream``.

Both follow the job's Redis Stream from a given id: any number of watchers, a late one
gets the retained history first, and ``Last-Event-ID`` (or ``?last_event_id=``) resumes
exactly after the last event seen. The stream ends with ``done`` (see
:mod:`api.job_stream`, shared with audio jobs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, WebSocket
from fastapi.responses import Response, StreamingResponse

from api.deps import CurrentOwner, VideosDep
from api.job_stream import follow, parse_cursor, serve_websocket, sse
from api.openapi import SSE, errors
from api.videos_service import VideoService
from models.errors import InvalidRequest

router = APIRouter(prefix="/v1/videos", tags=["videos"])


@router.get(
    "/{video_id}/events",
    response_class=Response,
    responses={200: SSE, **errors(400, 401, 404, 422)},
)
async def video_events(
    video_id: str,
    videos: VideosDep,
    owner: CurrentOwner,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id_q: Annotated[str | None, Query(alias="last_event_id")] = None,
) -> StreamingResponse:
    after = parse_cursor(last_event_id, last_event_id_q)
    await videos.state.blocking(videos.get_job, video_id, owner)  # 404 for others' jobs

    async def body() -> AsyncIterator[str]:
        async for entry in follow(videos.state, videos, video_id, owner, after):
            yield sse(entry)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


@router.websocket("/{video_id}/stream")
async def video_stream(websocket: WebSocket, video_id: str, last_event_id: str = "0-0") -> None:
    try:
        cursor = parse_cursor(None, last_event_id)
    except InvalidRequest as exc:  # refused before accepting, like a bad key
        await websocket.close(code=1008, reason=exc.message[:120])
        return
    await serve_websocket(websocket, VideoService(websocket.state.app), video_id, cursor)
