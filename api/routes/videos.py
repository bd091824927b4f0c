"""``/v1/videos``: thin routes over :class:`api.videos_service.VideoService`."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentOwner, StateDep, VideosDep
from api.forms import read_create_body
from api.videos_service import VideoService
from models.db import Artifact, JobStatus
from models.errors import (
    Gone,
    InvalidRequest,
    JobFailed,
    RangeNotSatisfiable,
    ServiceUnavailable,
    SyncTimeout,
)
from models.videos import VideoDeleted, VideoObject, VideoPage
from storage.artifacts import ObjectMissing, StorageError

router = APIRouter(prefix="/v1/videos", tags=["videos"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 256 * 1024


def _object_response(state_poll_ms: int, video: VideoObject) -> JSONResponse:
    headers = {"openai-poll-after-ms": str(state_poll_ms)}
    return JSONResponse(video.model_dump(mode="json"), headers=headers)


@router.post("", response_model=VideoObject)
async def create_video(
    request: Request, videos: VideosDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> JSONResponse:
    raw, reference = await read_create_body(request, videos.settings.limits)
    video, _ = await videos.create(raw, reference, owner, idempotency_key)
    return _object_response(videos.settings.poll_after_ms, video)


@router.post("/sync", response_class=Response)
async def create_video_sync(
    request: Request, videos: VideosDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> Response:
    """Create and wait; the MP4 bytes, or 504 after the sync timeout (the job is cancelled).
    A client that disconnects cancels its job."""
    raw, reference = await read_create_body(request, videos.settings.limits)
    video, _ = await videos.create(raw, reference, owner, idempotency_key)
    deadline = time.monotonic() + videos.settings.sync_timeout_s
    while True:
        job = await run_in_threadpool(videos.get_job, video.id, owner)
        if job.status in (JobStatus.COMPLETED, JobStatus.FAILED):
            break
        if await request.is_disconnected():
            await run_in_threadpool(videos.cancel_job, video.id, "client disconnected")
            return Response(status_code=499)
        if time.monotonic() >= deadline:
            await run_in_threadpool(videos.cancel_job, video.id, "sync timeout")
            raise SyncTimeout(
                f"video {video.id} did not finish within {videos.settings.sync_timeout_s:g} s "
                "and was cancelled",
                param="timeout",
            )
        await asyncio.sleep(0.2)
    if job.status == JobStatus.FAILED:
        raise JobFailed(
            f"video {video.id} failed: {job.error_message or 'the job failed'}",
            code=job.error_code or "internal_error",
        )
    _, artifact = await run_in_threadpool(videos.content_artifact, video.id, owner, "video")
    headers = {
        "X-Request-Id": video.id,
        "X-Inference-Time-S": f"{job.inference_time_s or 0.0:.3f}",
    }
    return await _stream_artifact(videos, artifact, None, headers)


@router.get("", response_model=VideoPage)
async def list_videos(
    videos: VideosDep,
    owner: CurrentOwner,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> VideoPage:
    return await run_in_threadpool(videos.page, owner, after, limit, order)


@router.get("/{video_id}", response_model=VideoObject)
async def retrieve_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> JSONResponse:
    video = await run_in_threadpool(videos.retrieve, video_id, owner)
    return _object_response(videos.settings.poll_after_ms, video)


@router.delete("/{video_id}", response_model=VideoDeleted)
async def delete_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> VideoDeleted:
    await run_in_threadpool(videos.delete, video_id, owner)
    return VideoDeleted(id=video_id)


@router.post("/{video_id}/cancel", response_model=VideoObject)
async def cancel_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> JSONResponse:
    video = await run_in_threadpool(videos.cancel, video_id, owner)
    return _object_response(videos.settings.poll_after_ms, video)


@router.get("/{video_id}/content")
async def video_content(
    video_id: str,
    videos: VideosDep,
    owner: CurrentOwner,
    state: StateDep,
    variant: Literal["video", "thumbnail", "spritesheet"] = "video",
    redirect: bool | None = None,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> Response:
    job, artifact = await run_in_threadpool(videos.content_artifact, video_id, owner, variant)
    if redirect if redirect is not None else state.settings.s3.redirect_content:
        ext = "mp4" if variant == "video" else "jpg"
        url = await run_in_threadpool(
            state.artifacts.presign_get, artifact.key, filename=f"{job.id}.{ext}"
        )
        return RedirectResponse(url, status_code=302)
    return await _stream_artifact(videos, artifact, range_header, {})


async def _stream_artifact(
    videos: VideoService, artifact: Artifact, range_header: str | None, headers: dict[str, str]
) -> Response:
    store = videos.state.artifacts
    size = artifact.size_bytes
    start: int | None = None
    end: int | None = None
    if range_header:
        start, end = _parse_range(range_header, size)
    try:
        obj = await run_in_threadpool(store.open, artifact.key, start, end)
    except ObjectMissing as exc:
        raise Gone(
            f"the content of {artifact.job_id} is no longer stored", param="video_id"
        ) from exc
    except StorageError as exc:
        raise ServiceUnavailable("object storage is unavailable", code="storage_error") from exc
    out = {
        **headers,
        "Accept-Ranges": "bytes",
        "Content-Length": str(obj.content_length),
        "Cache-Control": "private, max-age=3600",
    }
    status = 200
    if obj.partial:
        status = 206
        out["Content-Range"] = f"bytes {obj.start}-{obj.end}/{obj.total_size}"
    return StreamingResponse(
        obj.body.iter_chunks(_CHUNK),
        status_code=status,
        media_type=artifact.content_type,
        headers=out,
    )


def _parse_range(header: str, size: int) -> tuple[int, int]:
    """One ``bytes=a-b`` range → inclusive (start, end); 416 when unsatisfiable."""
    m = _RANGE_RE.match(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        raise InvalidRequest("Range must look like 'bytes=START-END'", param="Range")
    if not m.group(1):  # suffix: the last N bytes
        n = int(m.group(2))
        start, end = max(size - n, 0), size - 1
    else:
        start = int(m.group(1))
        end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    if start >= size or start > end:
        raise RangeNotSatisfiable(
            f"Range {header} is outside the {size}-byte object", param="Range"
        )
    return start, end
