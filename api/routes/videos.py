"""``/v1/videos``: thin routes over :class:`api.videos_service.VideoService`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from api.content import stream_artifact
from api.deps import CurrentOwner, StateDep, VideosDep
from api.forms import read_create_body
from api.jobs_service import ClientGone
from api.responses import json_response
from models.videos import VideoDeleted, VideoObject, VideoPage

router = APIRouter(prefix="/v1/videos", tags=["videos"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]


def _object_response(state_poll_ms: int, video: VideoObject) -> Response:
    return json_response(video, {"openai-poll-after-ms": str(state_poll_ms)})


@router.post("", response_model=VideoObject)
async def create_video(
    request: Request, videos: VideosDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> Response:
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
    try:
        job = await videos.wait_done(request, video.id, owner)
    except ClientGone:
        return Response(status_code=499)
    artifact = await run_in_threadpool(videos.artifact_of, job, "video")
    headers = {
        "X-Request-Id": video.id,
        "X-Inference-Time-S": f"{job.inference_time_s or 0.0:.3f}",
    }
    return await stream_artifact(videos.state.artifacts, artifact, None, headers)


@router.get("", response_model=VideoPage)
async def list_videos(
    videos: VideosDep,
    owner: CurrentOwner,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    return json_response(await run_in_threadpool(videos.page, owner, after, limit, order))


@router.get("/{video_id}", response_model=VideoObject)
async def retrieve_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> Response:
    video = await run_in_threadpool(videos.retrieve, video_id, owner)
    return _object_response(videos.settings.poll_after_ms, video)


@router.delete("/{video_id}", response_model=VideoDeleted)
async def delete_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> VideoDeleted:
    await run_in_threadpool(videos.delete, video_id, owner)
    return VideoDeleted(id=video_id)


@router.post("/{video_id}/cancel", response_model=VideoObject)
async def cancel_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> Response:
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
    return await stream_artifact(state.artifacts, artifact, range_header, {})
