"""Synchronous audio: ``POST /v1/audio/speech`` (OpenAI text-to-speech) and
``POST /v1/audio/generate`` (vLLM-Omni). Both create an ordinary audio job (its id is the
``X-Request-Id`` header; it is listed under ``/v1/audio/generations``) and answer with the
audio bytes.

``response_format="pcm"`` speech streams: the body is raw PCM16 (mono, 24 kHz unless
``sample_rate``) forwarded from the job's ``chunk`` events as the worker publishes them;
with ``stream_format="sse"`` the same samples come as OpenAI ``speech.audio.delta`` events
ending with ``speech.audio.done``. A client that disconnects, or the sync timeout, cancels
the job.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response, StreamingResponse

from api.audio_service import AudioService
from api.content import stream_artifact
from api.deps import AudioDep, CurrentOwner
from api.forms import read_create_body
from api.job_stream import BUS_ERROR, follow
from api.jobs_service import ClientGone
from api.openapi import AUDIO_MEDIA_TYPES, binary, create_body, errors
from models.audio import (
    AudioGenerate,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechCreate,
    SpeechUsage,
)
from models.db import Job
from models.errors import InvalidRequest, JobFailed, ServiceUnavailable, SyncTimeout
from storage.bus import BusEntry

router = APIRouter(prefix="/v1/audio", tags=["audio"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]
_ERRORS = errors(400, 401, 409, 413, 422, 503, 504)
_HEADERS = {"X-Request-Id": "The id of the audio job.", "X-Sample-Rate": "Hz", "X-Channels": "1|2"}


async def _body(request: Request, audio: AudioService) -> dict[str, Any]:
    raw, upload = await read_create_body(request, audio.settings.limits)
    if upload is not None:
        raise InvalidRequest("this endpoint takes no file", param="input_reference")
    return raw


@router.post(
    "/generate",
    response_class=Response,
    responses={200: binary("The encoded file.", *AUDIO_MEDIA_TYPES, headers=_HEADERS), **_ERRORS},
    openapi_extra=create_body(AudioGenerate),
)
async def generate(
    request: Request, audio: AudioDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> Response:
    """vLLM-Omni's diffusion audio request; the encoded file once the job completes."""
    job = await audio.create_generate(await _body(request, audio), owner, idempotency_key)
    return await _finished_file(request, audio, job, owner)


@router.post(
    "/speech",
    response_class=Response,
    responses={
        200: binary(
            "The encoded file; raw PCM16 for `pcm`, or OpenAI `speech.audio.delta` events "
            "(`text/event-stream`) with `stream_format=sse`.",
            *AUDIO_MEDIA_TYPES,
            "text/event-stream",
            headers=_HEADERS,
        ),
        **_ERRORS,
    },
    openapi_extra=create_body(SpeechCreate),
)
async def speech(
    request: Request, audio: AudioDep, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
) -> Response:
    """OpenAI text-to-speech: the audio file, or a PCM16 / SSE stream for ``pcm``."""
    job, body = await audio.create_speech(await _body(request, audio), owner, idempotency_key)
    if job.params.get("stream_pcm"):
        return await _pcm_stream(request, audio, job, owner, sse=body.stream_format == "sse")
    return await _finished_file(request, audio, job, owner)


async def _finished_file(request: Request, audio: AudioService, job: Job, owner: str) -> Response:
    try:
        done = await audio.wait_done(request, job.id, owner)
    except ClientGone:
        return Response(status_code=499)
    artifact = await audio.state.blocking(audio.artifact_of, done, "audio")
    output = done.params.get("output") or {}
    headers = {
        "X-Request-Id": job.id,
        "X-Inference-Time-S": f"{done.inference_time_s or 0.0:.3f}",
        "X-Sample-Rate": str(output.get("sample_rate")),
        "X-Channels": str(output.get("channels")),
    }
    return await stream_artifact(audio.state.artifacts, artifact, None, headers, "audio_id")


async def _pcm_stream(
    request: Request, audio: AudioService, job: Job, owner: str, *, sse: bool
) -> Response:
    """Wait for the first chunk (so a job that fails early still gets an error status),
    then forward chunks until ``done``. Leaving early cancels the job."""
    deadline = time.monotonic() + audio.settings.sync_timeout_s
    events = follow(audio.state, audio, job.id, owner, "0-0")
    first: BusEntry | None = None
    async for entry in events:
        if entry is not None and entry.type == "chunk" and entry.data is not None:
            first = entry
            break
        if entry is BUS_ERROR:  # nothing sent yet: a plain 503
            raise ServiceUnavailable("the event bus is unavailable", code="broker_error")
        if entry is not None and entry.type == "done":
            if entry.event.get("status") == "failed":
                error = entry.event.get("error") or {}
                raise JobFailed(
                    f"audio {job.id} failed: {error.get('message') or 'the job failed'}",
                    code=error.get("code") or "internal_error",
                )
            # Completed without chunks (the events expired): serve the stored file.
            return await _finished_file(request, audio, job, owner)
        if await request.is_disconnected():
            await audio.cancel_quietly(job.id, "client disconnected")
            return Response(status_code=499)
        if time.monotonic() >= deadline:
            await audio.cancel_quietly(job.id, "sync timeout")
            raise SyncTimeout(f"audio {job.id} did not start within the sync timeout")
    assert first is not None

    async def body() -> AsyncIterator[bytes]:
        finished = False
        try:
            yield _sse_delta(first.data or b"") if sse else first.data or b""
            async for entry in events:
                if entry is None:
                    continue
                if entry.type == "chunk" and entry.data is not None:
                    yield _sse_delta(entry.data) if sse else entry.data
                elif entry.type == "done":
                    finished = True
                    if sse:
                        yield _sse_done(entry.event)
                    break
            else:
                finished = True  # the job was deleted meanwhile
        finally:
            if not finished:
                await audio.cancel_quietly(job.id, "client disconnected")

    output_rate = job.params.get("sample_rate") or 24_000
    headers = {
        "X-Request-Id": job.id,
        "X-Sample-Rate": str(output_rate),
        "X-Channels": str(job.params.get("channels") or 1),
        "Cache-Control": "no-cache",
    }
    media_type = "text/event-stream" if sse else "audio/pcm"
    return StreamingResponse(body(), media_type=media_type, headers=headers)


def _sse_delta(data: bytes) -> bytes:
    event = SpeechAudioDelta(audio=base64.b64encode(data).decode())
    return f"data: {event.model_dump_json()}\n\n".encode()


def _sse_done(done: dict[str, Any]) -> bytes:
    """``speech.audio.done`` (usage is not counted in tokens here), or an ``error`` event
    when the job failed after audio had been sent."""
    if done.get("status") == "failed":
        error = done.get("error") or {}
        body = {
            "type": "error",
            "error": {"message": error.get("message"), "code": error.get("code")},
        }
        return f"data: {json.dumps(body)}\n\n".encode()
    return f"data: {SpeechAudioDone(usage=SpeechUsage()).model_dump_json()}\n\n".encode()
