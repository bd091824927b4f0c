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

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.admission import Admitted, admission
from api.audio_service import AudioService, audio_spec
from api.audio_sync import finished_file, pcm_stream
from api.create_requests import parse_generate_body, parse_speech_body
from api.deps import IdempotencyKey
from api.forms import read_create_body
from api.openapi import AUDIO_MEDIA_TYPES, binary, create_body, errors
from models.audio import AudioGenerate, SpeechCreate
from models.db import Job

router = APIRouter(prefix="/v1/audio", tags=["audio"])

_ERRORS = errors(400, 401, 409, 413, 422, 429, 503, 504)
# The service, the caller and the create's rate-limit headers (api/admission.py).
AudioCall = Annotated[Admitted[AudioService], admission(AudioService)]
_HEADERS = {"X-Request-Id": "The id of the audio job.", "X-Sample-Rate": "Hz", "X-Channels": "1|2"}


@router.post(
    "/generate",
    response_class=Response,
    responses={200: binary("The encoded file.", *AUDIO_MEDIA_TYPES, headers=_HEADERS), **_ERRORS},
    openapi_extra=create_body(AudioGenerate),
)
async def generate(
    request: Request, call: AudioCall, idempotency_key: IdempotencyKey = None
) -> Response:
    """vLLM-Omni's diffusion audio request; the encoded file once the job completes."""
    _, job = await _create(request, call, parse_generate_body, idempotency_key)
    return call.answer(await finished_file(request, call.service, job, call.owner))


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
    request: Request, call: AudioCall, idempotency_key: IdempotencyKey = None
) -> Response:
    """OpenAI text-to-speech: the audio file, or a PCM16 / SSE stream for ``pcm``."""
    body, job = await _create(request, call, parse_speech_body, idempotency_key)
    audio, owner = call.service, call.owner
    if audio_spec(job).stream_pcm:
        sse = body.stream_format == "sse"
        return call.answer(await pcm_stream(request, audio, job, owner, sse=sse))
    return call.answer(await finished_file(request, audio, job, owner))


_B = TypeVar("_B", SpeechCreate, AudioGenerate)


async def _create(
    request: Request, call: AudioCall, parse: Callable[..., _B], idempotency_key: str | None
) -> tuple[_B, Job]:
    """Read and parse the body (``parse``), store and enqueue the job; both."""
    body = parse(*await read_create_body(request, call.service.settings.limits))
    return body, await call.service.create_waited(body, call.owner, idempotency_key)
