"""``/v1/audio/generations``: the job routes of :class:`api.audio_service.AudioService`
(their shared bodies: ``api/routes/jobs.py``, ``api/routes/job_output.py``), the
lifecycle of ``/v1/videos``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import Response, StreamingResponse

from api.admission import Admitted, admission
from api.audio_service import AudioService
from api.create_requests import parse_audio
from api.deps import IdempotencyKey
from api.openapi import AUDIO_MEDIA_TYPES, SSE, create_body, errors
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
    create_job,
    delete_job,
    list_jobs,
    retrieve_job,
)
from models.audio import AudioCreate, AudioDeleted, AudioObject, AudioPage

router = APIRouter(prefix="/v1/audio/generations", tags=["audio"])
_caller = caller_of(AudioService)
# A create's caller, admitted (api/admission.py); the other routes' caller.
Admit = Annotated[Admitted[AudioService], admission(AudioService)]
Call = Annotated[Caller, Depends(_caller)]

_CONTENT_DOC = (
    "The encoded file (``Content-Type`` by format; ``pcm`` is raw s16le at the object's\n"
    "``sample_rate`` and ``channels``, also sent as ``X-Sample-Rate`` / ``X-Channels``)."
)
_EVENTS_DOC = (
    "Server-Sent Events of the job, as ``/v1/videos/{id}/events``; ``pcm`` jobs also get\n"
    "``chunk`` events with the PCM16 samples (base64 in ``data_b64``)."
)


@router.post(
    "",
    response_model=AudioObject,
    responses=errors(400, 401, 413, 422, 429, 503),
    openapi_extra=create_body(AudioCreate),
)
async def create_audio(
    request: Request, call: Admit, idempotency_key: IdempotencyKey = None
) -> Response:
    return await create_job(request, call, parse_audio, idempotency_key)


@router.get("", response_model=AudioPage, responses=errors(400, 401, 422))
async def list_audio(
    call: Call, after: str | None = None, limit: PageLimit = 20, order: PageOrder = "desc"
) -> Response:
    return await list_jobs(call, after, limit, order)


@router.get("/{audio_id}", response_model=AudioObject, responses=errors(401, 404, 422))
async def retrieve_audio(request: Request, audio_id: str) -> Response:
    return await retrieve_job(request, audio_id, _caller)


@router.delete("/{audio_id}", response_model=AudioDeleted, responses=errors(401, 404, 422, 503))
async def delete_audio(audio_id: str, call: Call) -> Response:
    return await delete_job(call, audio_id, AudioDeleted)


@router.post("/{audio_id}/cancel", response_model=AudioObject, responses=errors(401, 404, 422))
async def cancel_audio(audio_id: str, call: Call) -> Response:
    return await cancel_job(call, audio_id)


@router.get(
    "/{audio_id}/content",
    description=_CONTENT_DOC,
    response_class=Response,
    responses=content_responses("The encoded file, by `response_format`.", AUDIO_MEDIA_TYPES),
)
async def audio_content(
    audio_id: str, call: Call, redirect: Redirect, range_header: RangeHeader = None
) -> Response:
    # one artifact per audio job: no ``?variant=``
    return await job_content(call, audio_id, "audio", redirect, range_header)


@router.get(
    "/{audio_id}/events",
    description=_EVENTS_DOC,
    response_class=Response,
    responses={200: SSE, **errors(400, 401, 404, 422)},
)
async def audio_events(
    audio_id: str,
    call: Call,
    last_event_id: LastEventId = None,
    last_event_id_q: LastEventIdQuery = None,
) -> StreamingResponse:
    return await job_events(call, audio_id, last_event_id, last_event_id_q)


@router.websocket("/{audio_id}/stream")
async def audio_stream(websocket: WebSocket, audio_id: str, last_event_id: str = "0-0") -> None:
    await job_stream(websocket, AudioService, audio_id, last_event_id)
