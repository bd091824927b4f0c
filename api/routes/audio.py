"""``/v1/audio/generations``: async audio jobs, thin routes over
:class:`api.audio_service.AudioService` (the lifecycle of ``/v1/videos``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.audio_service import AudioService
from api.content import stream_artifact
from api.deps import AudioDep, CurrentOwner
from api.forms import read_create_body
from api.job_stream import follow, serve_websocket, sse
from api.responses import json_response
from models.audio import EXTENSIONS, AudioDeleted, AudioObject, AudioPage

router = APIRouter(prefix="/v1/audio/generations", tags=["audio"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]


def _object_response(poll_ms: int, audio: AudioObject) -> Response:
    return json_response(audio, {"openai-poll-after-ms": str(poll_ms)})


@router.post("", response_model=AudioObject)
async def create_audio(
    request: Request, audio: AudioDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> Response:
    raw, upload = await read_create_body(request, audio.settings.limits)
    created = await audio.create(raw, upload, owner, idempotency_key)
    return _object_response(audio.settings.poll_after_ms, created)


@router.get("", response_model=AudioPage)
async def list_audio(
    audio: AudioDep,
    owner: CurrentOwner,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    return json_response(await run_in_threadpool(audio.page, owner, after, limit, order))


@router.get("/{audio_id}", response_model=AudioObject)
async def retrieve_audio(audio_id: str, audio: AudioDep, owner: CurrentOwner) -> Response:
    found = await run_in_threadpool(audio.retrieve, audio_id, owner)
    return _object_response(audio.settings.poll_after_ms, found)


@router.delete("/{audio_id}", response_model=AudioDeleted)
async def delete_audio(audio_id: str, audio: AudioDep, owner: CurrentOwner) -> AudioDeleted:
    await run_in_threadpool(audio.delete, audio_id, owner)
    return AudioDeleted(id=audio_id)


@router.post("/{audio_id}/cancel", response_model=AudioObject)
async def cancel_audio(audio_id: str, audio: AudioDep, owner: CurrentOwner) -> Response:
    found = await run_in_threadpool(audio.cancel, audio_id, owner)
    return _object_response(audio.settings.poll_after_ms, found)


@router.get("/{audio_id}/content")
async def audio_content(
    audio_id: str,
    audio: AudioDep,
    owner: CurrentOwner,
    redirect: bool | None = None,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> Response:
    """The encoded file (``Content-Type`` by format; ``pcm`` is raw s16le at the object's
    ``sample_rate`` and ``channels``, also sent as ``X-Sample-Rate`` / ``X-Channels``)."""
    job, artifact = await run_in_threadpool(audio.content_artifact, audio_id, owner, "audio")
    fmt = str(job.params.get("response_format") or "wav")
    if redirect if redirect is not None else audio.settings.s3.redirect_content:
        url = await run_in_threadpool(
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


@router.get("/{audio_id}/events")
async def audio_events(
    audio_id: str,
    audio: AudioDep,
    owner: CurrentOwner,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id_q: Annotated[str | None, Query(alias="last_event_id")] = None,
) -> StreamingResponse:
    """Server-Sent Events of the job, as ``/v1/videos/{id}/events``; ``pcm`` jobs also get
    ``chunk`` events with the PCM16 samples (base64 in ``data_b64``)."""
    await run_in_threadpool(audio.get_job, audio_id, owner)  # 404 for others' jobs
    after = last_event_id or last_event_id_q or "0-0"

    async def body() -> AsyncIterator[str]:
        async for entry in follow(audio.state, audio, audio_id, owner, after):
            yield sse(entry)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


@router.websocket("/{audio_id}/stream")
async def audio_stream(websocket: WebSocket, audio_id: str, last_event_id: str = "0-0") -> None:
    """The job's events over a WebSocket, as ``WS /v1/videos/{id}/stream``; a ``pcm`` job's
    ``chunk`` events are each followed by one binary frame of PCM16."""
    await serve_websocket(websocket, AudioService(websocket.state.app), audio_id, last_event_id)
