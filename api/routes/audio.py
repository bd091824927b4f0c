"""``/v1/audio/generations``: the job routes (:mod:`api.routes.jobs`) of
:class:`api.audio_service.AudioService`, the lifecycle of ``/v1/videos``."""

from __future__ import annotations

from api.audio_service import AudioService
from api.create_requests import parse_audio
from api.job_kinds import JobKind
from api.openapi import AUDIO_MEDIA_TYPES
from api.routes.jobs import job_router
from models.audio import AudioCreate, AudioDeleted, AudioObject, AudioPage


def _variant() -> str:
    return "audio"  # one artifact per audio job


AUDIO = JobKind(
    prefix="/v1/audio/generations",
    tag="audio",
    noun="audio",
    plural="audio",
    service=AudioService,
    create=AudioCreate,
    parse=parse_audio,
    object=AudioObject,
    page=AudioPage,
    deleted=AudioDeleted,
    media_types=AUDIO_MEDIA_TYPES,
    content_200="The encoded file, by `response_format`.",
    variant=_variant,
    content_doc="The encoded file (``Content-Type`` by format; ``pcm`` is raw s16le at the "
    "object's\n``sample_rate`` and ``channels``, also sent as ``X-Sample-Rate`` / "
    "``X-Channels``).",
    events_doc="Server-Sent Events of the job, as ``/v1/videos/{id}/events``; ``pcm`` jobs "
    "also get\n``chunk`` events with the PCM16 samples (base64 in ``data_b64``).",
)
router = job_router(AUDIO)
