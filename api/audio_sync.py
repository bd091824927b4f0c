"""The replies of the synchronous audio routes (``api/routes/speech.py``): the finished
file once the job completes, or its PCM16 forwarded from the job's ``chunk`` events as the
worker publishes them (raw, or as OpenAI ``speech.audio.delta`` events). Leaving early, or
the sync timeout, cancels the job.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from api.audio_service import AudioService, audio_spec
from api.job_stream import BUS_ERROR, follow
from api.sync_wait import cancel_quietly, file_when_done
from models.audio import SpeechAudioDelta, SpeechAudioDone
from models.common import JobError
from models.db import JobView
from models.errors import JobFailed, ServiceUnavailable, SyncTimeout
from models.events import DoneEvent, StreamErrorEvent
from storage.bus import BusEntry


async def finished_file(
    request: Request, audio: AudioService, job: JobView, owner: str
) -> Response:
    return await file_when_done(audio, request, job.id, owner, "audio", audio.content_headers)


async def pcm_stream(
    request: Request, audio: AudioService, job: JobView, owner: str, *, sse: bool
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
            ended = DoneEvent.model_validate(entry.event)
            if ended.status == "failed":
                error = ended.error or JobError(code="internal_error", message="")
                raise JobFailed(
                    f"audio {job.id} failed: {error.message or 'the job failed'}",
                    code=error.code or "internal_error",
                )
            # Completed without chunks (the events expired): serve the stored file.
            return await finished_file(request, audio, job, owner)
        if await request.is_disconnected():
            await cancel_quietly(audio, job.id, "client disconnected")
            return Response(status_code=499)
        if time.monotonic() >= deadline:
            await cancel_quietly(audio, job.id, "sync timeout")
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
                await cancel_quietly(audio, job.id, "client disconnected")

    spec = audio_spec(job)
    headers = {
        "X-Request-Id": job.id,
        "X-Sample-Rate": str(spec.sample_rate or 24_000),
        "X-Channels": str(spec.channels or 1),
        "Cache-Control": "no-cache",
    }
    media_type = "text/event-stream" if sse else "audio/pcm"
    return StreamingResponse(body(), media_type=media_type, headers=headers)


def _sse_delta(data: bytes) -> bytes:
    event = SpeechAudioDelta(audio=base64.b64encode(data).decode())
    return f"data: {event.model_dump_json()}\n\n".encode()


def _sse_done(done: dict[str, Any]) -> bytes:
    """``speech.audio.done`` (without ``usage``: nothing here counts tokens), or an ``error`` event
    when the job failed after audio had been sent."""
    ended = DoneEvent.model_validate(done)
    if ended.status == "failed":
        error = ended.error or JobError(code="internal_error", message="the job failed")
        return f"data: {StreamErrorEvent(error=error).model_dump_json()}\n\n".encode()
    return f"data: {SpeechAudioDone().model_dump_json()}\n\n".encode()
