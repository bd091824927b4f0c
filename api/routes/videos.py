"""``/v1/videos``: the job routes of :class:`api.videos_service.VideoService` (their
shared bodies: ``api/routes/jobs.py``, ``api/routes/job_output.py``), and
``POST /v1/videos/sync``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, WebSocket
from fastapi.responses import Response, StreamingResponse

from api.admission import Admitted, admission
from api.create_requests import parse_video
from api.deps import IdempotencyKey
from api.openapi import SSE, VIDEO_MEDIA_TYPES, binary, create_body, errors
from api.routes.job_output import (
    LastEventId,
    LastEventIdQuery,
    RangeHeader,
    Redirect,
    content_responses,
    job_content,
    job_events,
    job_stream,
)
from api.routes.jobs import (
    Caller,
    PageLimit,
    PageOrder,
    caller_of,
    cancel_job,
    create_from_body,
    create_job,
    delete_job,
    list_jobs,
    retrieve_job,
)
from api.sync_wait import file_when_done
from api.videos_service import VideoService
from models.catalog import MAX_OUTPUTS
from models.errors import InvalidRequest
from models.job_specs import output_variant
from models.videos import VideoCreate, VideoDeleted, VideoObject, VideoPage

_VARIANTS = ("video", "thumbnail", "spritesheet")


def _variant(
    variant: Annotated[str, Query(json_schema_extra={"enum": list(_VARIANTS)})] = "video",
    index: Annotated[
        str | None,
        Query(
            description="Which output of a job of `n` outputs (0 to n - 1; default 0).",
            json_schema_extra={"type": "integer", "minimum": 0, "maximum": MAX_OUTPUTS - 1},
        ),
    ] = None,
) -> str:
    """``?variant=`` of output ``?index=``: the artifact's stored variant. Another value
    is a 400 naming it, as for every other bad parameter (a ``Literal`` or an ``int`` here
    made it FastAPI's 422)."""
    if variant not in _VARIANTS:
        raise InvalidRequest(f"variant must be one of {', '.join(_VARIANTS)}", param="variant")
    if index is None:
        return variant
    if not index.isascii() or not index.isdigit() or int(index) >= MAX_OUTPUTS:
        raise InvalidRequest(
            f"index must be an output's index, 0 to {MAX_OUTPUTS - 1}", param="index"
        )
    return output_variant(variant, int(index))


router = APIRouter(prefix="/v1/videos", tags=["videos"])
_caller = caller_of(VideoService)
# A create's caller, admitted (api/admission.py); the other routes' caller.
Admit = Annotated[Admitted[VideoService], admission(VideoService)]
Call = Annotated[Caller, Depends(_caller)]
Variant = Annotated[str, Depends(_variant)]


@router.post(
    "",
    response_model=VideoObject,
    responses=errors(400, 401, 413, 422, 429, 503),
    openapi_extra=create_body(VideoCreate),
)
async def create_video(
    request: Request, call: Admit, idempotency_key: IdempotencyKey = None
) -> Response:
    return await create_job(request, call, parse_video, idempotency_key)


@router.get("", response_model=VideoPage, responses=errors(400, 401, 422))
async def list_videos(
    call: Call, after: str | None = None, limit: PageLimit = 20, order: PageOrder = "desc"
) -> Response:
    return await list_jobs(call, after, limit, order)


@router.get("/{video_id}", response_model=VideoObject, responses=errors(401, 404, 422))
async def retrieve_video(request: Request, video_id: str) -> Response:
    return await retrieve_job(request, video_id, _caller)


@router.delete("/{video_id}", response_model=VideoDeleted, responses=errors(401, 404, 422, 503))
async def delete_video(video_id: str, call: Call) -> Response:
    return await delete_job(call, video_id, VideoDeleted)


@router.post("/{video_id}/cancel", response_model=VideoObject, responses=errors(401, 404, 422))
async def cancel_video(video_id: str, call: Call) -> Response:
    return await cancel_job(call, video_id)


@router.get(
    "/{video_id}/content",
    response_class=Response,
    responses=content_responses("The MP4 (`variant=video`) or a JPEG image.", VIDEO_MEDIA_TYPES),
)
async def video_content(
    video_id: str,
    call: Call,
    variant: Variant,
    redirect: Redirect,
    range_header: RangeHeader = None,
) -> Response:
    return await job_content(call, video_id, variant, redirect, range_header)


@router.get(
    "/{video_id}/events",
    response_class=Response,
    responses={200: SSE, **errors(400, 401, 404, 422)},
)
async def video_events(
    video_id: str,
    call: Call,
    last_event_id: LastEventId = None,
    last_event_id_q: LastEventIdQuery = None,
) -> StreamingResponse:
    return await job_events(call, video_id, last_event_id, last_event_id_q)


@router.websocket("/{video_id}/stream")
async def video_stream(websocket: WebSocket, video_id: str, last_event_id: str = "0-0") -> None:
    await job_stream(websocket, VideoService, video_id, last_event_id)


_SYNC_HEADERS = {
    "X-Request-Id": "The id of the job.",
    "X-Inference-Time-S": "Seconds the worker spent on the job.",
}


@router.post(
    "/sync",
    response_class=Response,
    responses={
        200: binary("The MP4 of the finished job.", "video/mp4", headers=_SYNC_HEADERS),
        **errors(400, 401, 409, 413, 422, 429, 503, 504),
    },
    openapi_extra=create_body(VideoCreate),
)
async def create_video_sync(
    request: Request, call: Admit, idempotency_key: IdempotencyKey = None
) -> Response:
    """Create and wait; the MP4 bytes, or 504 after the sync timeout (the job is cancelled).
    A client that disconnects cancels its job."""
    videos, owner = call.service, call.owner
    video = await create_from_body(request, videos, owner, parse_video, idempotency_key)
    return call.answer(await file_when_done(videos, request, video.id, owner, "video"))
