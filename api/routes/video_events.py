"""Live job events: ``GET /v1/videos/{id}/events`` (SSE) and ``WS /v1/videos/{id}/stream``.

Both follow the job's Redis Stream from a given id: any number of watchers, a late one
gets the retained history first, and ``Last-Event-ID`` (or ``?last_event_id=``) resumes
exactly after the last event seen. The stream ends with ``done``. When the stream has
expired (or a ``done`` was never published) the job row is the truth: a watcher of a
finished job gets a ``status`` and a ``done`` made from it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentOwner, VideosDep, websocket_owner
from api.state import AppState
from api.videos_service import VideoService
from models.db import JobStatus
from models.errors import OmniqueueError
from models.events import DoneEvent, StatusEvent
from models.videos import VideoError
from storage.bus import BusEntry
from storage.constants import job_events_key

router = APIRouter(prefix="/v1/videos", tags=["videos"])

BLOCK_MS = 15_000
# Ids of events made from the job row; they sort before any real stream id.
_SYNTHETIC = ("0-1", "0-2")


def _synthetic(videos: VideoService, job_id: str, owner: str) -> list[BusEntry] | None:
    """``status`` + ``done`` from the row if the job has ended, else None."""
    try:
        job = videos.get_job(job_id, owner)
    except OmniqueueError:
        return []  # deleted meanwhile: end the stream
    if job.status not in (JobStatus.COMPLETED, JobStatus.FAILED):
        return None
    error = None
    if job.status == JobStatus.FAILED:
        error = VideoError(code=job.error_code or "internal_error", message=job.error_message or "")
    status = job.status.value if isinstance(job.status, JobStatus) else str(job.status)
    events = [
        StatusEvent(status=status),
        DoneEvent(status=status, error=error),
    ]
    return [BusEntry(i, e.model_dump(mode="json")) for i, e in zip(_SYNTHETIC, events, strict=True)]


async def follow(
    state: AppState, videos: VideoService, job_id: str, owner: str, after: str
) -> AsyncIterator[BusEntry | None]:
    """The job's events after ``after``, then live ones, ending with ``done``; yields None
    as a keep-alive when nothing happened for a while."""
    stream = job_events_key(job_id)
    while True:
        entries = await state.abus.read(stream, after, block_ms=BLOCK_MS)
        if not entries:
            synthetic = await run_in_threadpool(_synthetic, videos, job_id, owner)
            if synthetic is not None:
                for entry in synthetic:
                    if entry.id > after:  # synthetic ids sort before real ones
                        yield entry
                return
            yield None
            continue
        for entry in entries:
            after = entry.id
            yield entry
            if entry.type == "done":
                return


def _wire(entry: BusEntry) -> dict[str, Any]:
    return {"id": entry.id, **entry.event}


def _sse(entry: BusEntry | None) -> str:
    if entry is None:
        return ": keep-alive\n\n"
    body = _wire(entry)
    if entry.data is not None:
        body["data_b64"] = base64.b64encode(entry.data).decode()
    return f"id: {entry.id}\nevent: {entry.type}\ndata: {json.dumps(body)}\n\n"


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
            yield _sse(entry)

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
            message = _wire(entry)
            if entry.data is not None:
                message["byte_length"] = len(entry.data)
            await websocket.send_text(json.dumps(message))
            if entry.data is not None:
                await websocket.send_bytes(entry.data)
        await websocket.close(code=1000)
    except WebSocketDisconnect:
        return
