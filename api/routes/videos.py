"""``/v1/videos``: thin routes over :class:`api.videos_service.VideoService`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import RedirectResponse, Response

from api.content import stream_artifact
from api.deps import CurrentOwner, StateDep, VideosDep
from api.forms import read_create_body
from api.jobs_service import ClientGone
from api.openapi import REDIRECT, VIDEO_MEDIA_TYPES, binary, create_body, errors
from api.responses import json_response
from models.videos import VideoCreate, VideoDeleted, VideoObject, VideoPage

router = APIRouter(prefix="/v1/videos", tags=["videos"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]
_SYNC_HEADERS = {
    "X-Request-Id": "The id of the job.",
    "X-Inference-Time-S": "Seconds the worker spent on the job.",
}


def _object_response(state_poll_ms: int, video: VideoObject) -> Response:
    return json_response(video, {"openai-poll-after-ms": str(state_poll_ms)})


@router.post(
    "",
    response_model=VideoObject,
    responses=errors(400, 401, 413, 422, 503),
    openapi_extra=create_body(VideoCreate),
)
async def create_video(
    request: Request, videos: VideosDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> Response:
    raw, reference = await read_create_body(request, videos.settings.limits)
    video, _ = await videos.create(raw, reference, owner, idempotency_key)
    return _object_response(videos.settings.poll_after_ms, video)


@router.post(
    "/sync",
    response_class=Response,
    responses={
        200: binary("The MP4 of the finished job.", "video/mp4", headers=_SYNC_HEADERS),
        **errors(400, 401, 409, 413, 422, 503, 504),
    },
    openapi_extra=create_body(VideoCreate),
)
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
    artifact = await videos.state.blocking(videos.artifact_of, job, "video")
    headers = {
        "X-Request-Id": video.id,
        "X-Inference-Time-S": f"{job.inference_time_s or 0.0:.3f}",
    }
    return await stream_artifact(videos.state.artifacts, artifact, None, headers)


@router.get("", response_model=VideoPage, responses=errors(400, 401, 422))
async def list_videos(
    videos: VideosDep,
    owner: CurrentOwner,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    # An empty ``after=`` (what some clients send for "no cursor") is no cursor.
    return json_response(
        await videos.state.blocking(videos.page, owner, after or None, limit, order)
    )


@router.get("/{video_id}", response_model=VideoObject, responses=errors(401, 404, 422))
async def retrieve_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> Response:
    video = await videos.state.blocking(videos.retrieve, video_id, owner)
    return _object_response(videos.settings.poll_after_ms, video)


@router.delete("/{video_id}", response_model=VideoDeleted, responses=errors(401, 404, 422, 503))
async def delete_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> VideoDeleted:
    # S3 deletes: on the S3 pool, so a stalled S3 cannot starve database reads
    await videos.state.artifacts.run(videos.delete, video_id, owner)
    return VideoDeleted(id=video_id)


@router.post("/{video_id}/cancel", response_model=VideoObject, responses=errors(401, 404, 422))
async def cancel_video(video_id: str, videos: VideosDep, owner: CurrentOwner) -> Response:
    video = await videos.state.blocking(videos.cancel, video_id, owner)
    return _object_response(videos.settings.poll_after_ms, video)


@router.get(
    "/{video_id}/content",
    response_class=Response,
    responses={
        200: binary("The MP4 (`variant=video`) or a JPEG image.", *VIDEO_MEDIA_TYPES),
        206: binary("The requested byte range.", *VIDEO_MEDIA_TYPES),
        302: REDIRECT,
        **errors(400, 401, 404, 410, 416, 422, 503),
    },
)
async def video_content(
    video_id: str,
    videos: VideosDep,
    owner: CurrentOwner,
    state: StateDep,
    variant: Literal["video", "thumbnail", "spritesheet"] = "video",
    redirect: bool | None = None,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> Response:
    job, artifact = await state.blocking(videos.content_artifact, video_id, owner, variant)
    if redirect if redirect is not None else state.settings.s3.redirect_content:
        ext = "mp4" if variant == "video" else "jpg"
        url = await state.blocking(
            state.artifacts.presign_get, artifact.key, filename=f"{job.id}.{ext}"
        )
        return RedirectResponse(url, status_code=302)
    return await stream_artifact(state.artifacts, artifact, range_header, {})
