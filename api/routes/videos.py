"""``/v1/videos``: the job routes (:mod:`api.routes.jobs`) of
:class:`api.videos_service.VideoService`, and ``POST /v1/videos/sync``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response

from api.admission import Admitted, admission
from api.create_requests import parse_video
from api.deps import IdempotencyKey
from api.forms import read_create_body
from api.job_kinds import JobKind
from api.openapi import VIDEO_MEDIA_TYPES, binary, create_body, errors
from api.routes.jobs import job_router
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


VIDEOS = JobKind(
    prefix="/v1/videos",
    tag="videos",
    noun="video",
    plural="videos",
    service=VideoService,
    create=VideoCreate,
    parse=parse_video,
    object=VideoObject,
    page=VideoPage,
    deleted=VideoDeleted,
    media_types=VIDEO_MEDIA_TYPES,
    content_200="The MP4 (`variant=video`) or a JPEG image.",
    variant=_variant,
)
router = job_router(VIDEOS)

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
    request: Request,
    call: Annotated[Admitted[VideoService], admission(VideoService)],
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Create and wait; the MP4 bytes, or 504 after the sync timeout (the job is cancelled).
    A client that disconnects cancels its job."""
    videos, owner = call.service, call.owner
    raw, reference = await read_create_body(request, videos.settings.limits)
    video = await videos.create(parse_video(raw, reference), owner, idempotency_key)
    return call.answer(await file_when_done(videos, request, video.id, owner, "video"))
