"""``/v1/audio/generations``: async audio jobs, thin routes over
:class:`api.audio_service.AudioService` (the lifecycle of ``/v1/videos``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from api.audio_service import AudioService
from api.content import stream_artifact
from api.deps import AudioDep, CurrentOwner
from api.forms import read_create_body
from api.job_stream import follow, parse_cursor, serve_websocket, sse
from api.openapi import AUDIO_MEDIA_TYPES, REDIRECT, SSE, binary, create_body, errors
from api.responses import json_response
from models.audio import EXTENSIONS, AudioCreate, AudioDeleted, AudioObject, AudioPage
from models.errors import InvalidRequest

router = APIRouter(prefix="/v1/audio/generations", tags=["audio"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]


def _object_response(poll_ms: int, audio: AudioObject) -> Response:
    return json_response(audio, {"openai-poll-after-ms": str(poll_ms)})


@router.post(
    "",
    response_model=AudioObject,
    responses=errors(400, 401, 413, 422, 503),
    openapi_extra=create_body(AudioCreate),
)
async def create_audio(
    request: Request, audio: AudioDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> Response:
    raw, upload = await read_create_body(request, audio.settings.limits)
    created = await audio.create(raw, upload, owner, idempotency_key)
    return _object_response(audio.settings.poll_after_ms, created)


@router.get("", response_model=AudioPage, responses=errors(400, 401, 422))
async def list_audio(
    audio: AudioDep,
    owner: CurrentOwner,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    # An empty ``after=`` (what some clients send for "no cursor") is no cursor.
    return json_response(await audio.state.blocking(audio.page, owner, after or None, limit, order))


@router.get("/{audio_id}", response_model=AudioObject, responses=errors(401, 404, 422))
async def retrieve_audio(audio_id: str, audio: AudioDep, owner: CurrentOwner) -> Response:
    found = await audio.state.blocking(audio.retrieve, audio_id, owner)
    return _object_response(audio.settings.poll_after_ms, found)


@router.delete("/{audio_id}", response_model=AudioDeleted, responses=errors(401, 404, 422, 503))
async def delete_audio(audio_id: str, audio: AudioDep, owner: CurrentOwner) -> AudioDeleted:
    # S3 deletes: on the S3 pool, so a stalled S3 cannot starve database reads
    await audio.state.artifacts.run(audio.delete, audio_id, owner)
    return AudioDeleted(id=audio_id)


@router.post("/{audio_id}/cancel", response_model=AudioObject, responses=errors(401, 404, 422))
async def cancel_audio(audio_id: str, audio: AudioDep, owner: CurrentOwner) -> Response:
    found = await audio.state.blocking(audio.cancel, audio_id, owner)
    return _object_response(audio.settings.poll_after_ms, found)


@router.get(
    "/{audio_id}/content",
    response_class=Response,
    responses={
        200: binary("The encoded file, by `response_format`.", *AUDIO_MEDIA_TYPES),
        206: binary("The requested byte range.", *AUDIO_MEDIA_TYPES),
        302: REDIRECT,
        **errors(400, 401, 404, 410, 416, 422, 503),
    },
)
async def audio_content(
    audio_id: str,
    audio: AudioDep,
    owner: CurrentOwner,
    redirect: bool | None = None,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> Response:
    """The encoded file (``Content-Type`` by format; ``pcm`` is raw s16le at the object's
    ``sample_rate`` and ``channels``, also sent as ``X-Sample-Rate`` / ``X-Channels``)."""
    job, artifact = await audio.state.blocking(audio.content_artifact, audio_id, owner, "audio")
    fmt = str(job.params.get("response_format") or "wav")
    if redirect if redirect is not None else audio.settings.s3.redirect_content:
        url = await audio.state.blocking(
            audio.state.artifacts.presign_get, artifact.key, filename=f"{job.id}.{EXTENSIONS[fmt]}"
        )
        return RedirectResponse(url, status_code=302)
    output = job.params.get("output") or {}
    headers = {
        "X-Sample-Rate": str(output.get("sample_rate")),
        "X-Channels": str(output.get("channels")),
    }
    return await stream_artifact(
        audio.state.artifacts, artifact, range_header, headers, id_param="audio_id"
    )


@router.get(
    "/{audio_id}/events",
    response_class=Response,
    responses={200: SSE, **errors(400, 401, 404, 422)},
)
async def audio_events(
    audio_id: str,
    audio: AudioDep,
    owner: CurrentOwner,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id_q: Annotated[str | None, Query(alias="last_event_id")] = None,
) -> StreamingResponse:
    """Server-Sent Events of the job, as ``/v1/videos/{id}/events``; ``pcm`` jobs also get
    ``chunk`` events with the PCM16 samples (base64 in ``data_b64``)."""
    after = parse_cursor(last_event_id, last_event_id_q)
    await audio.state.blocking(audio.get_job, audio_id, owner)  # 404 for others' jobs

    async def body() -> AsyncIterator[str]:
        async for entry in follow(audio.state, audio, audio_id, owner, after):
            yield sse(entry)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


@router.websocket("/{audio_id}/stream")
async def audio_stream(websocket: WebSocket, audio_id: str, last_event_id: str = "0-0") -> None:
    """The job's events over a WebSocket, as ``WS /v1/videos/{id}/stream``; a ``pcm`` job's
    ``chunk`` events are each followed by one binary frame of PCM16."""
    try:
        cursor = parse_cursor(None, last_event_id)
    except InvalidRequest as exc:  # refused before accepting, like a bad key
        await websocket.close(code=1008, reason=exc.message[:120])
        return
    await serve_websocket(websocket, AudioService(websocket.state.app), audio_id, cursor)
