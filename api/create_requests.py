"""Create bodies → the typed requests the job services take.

A route reads the body (``api/forms.py``: JSON or multipart, the same field names), parses
it here into its kind's request model, and hands that to the service
(``api/jobs_service.py``); the service resolves it against the served models and stores
the job. Parsing is pure: errors are :class:`models.errors.InvalidRequest` naming the
field, raised before anything is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.audio_validation import parse_generate, parse_generation, parse_speech
from api.validation import parse_create
from models.audio import AudioCreate, AudioGenerate, SpeechCreate
from models.errors import InvalidRequest
from models.videos import VideoCreate


@dataclass(frozen=True, slots=True)
class VideoRequest:
    """``POST /v1/videos`` (and ``/sync``) parsed: the fields, and the reference files as
    the client sent them, in order (``input_reference``, ``input_references``), or an
    ``input_reference`` URL (http(s) or ``data:``; ``body.input_reference_url`` is the
    other spelling)."""

    body: VideoCreate
    reference_files: tuple[bytes, ...] = ()
    reference_url: str | None = None


def parse_video(raw: dict[str, Any], uploads: list[bytes]) -> VideoRequest:
    """A video create body; an ``input_reference`` given as text (a URL, or OpenAI's
    ``{"image_url": …}``) counts when no file was uploaded. OpenAI's other reference,
    ``{"file_id": …}``, names a file of a Files API this server does not have: refused,
    as is an object with neither key."""
    fields = dict(raw)
    value = fields.pop("input_reference", None)
    if isinstance(value, dict):
        value = _image_url(value)
    url = str(value) if not uploads and value else None
    return VideoRequest(parse_create(fields), tuple(uploads), url)


def _image_url(reference: dict[str, Any]) -> Any:
    """The URL of an ``input_reference`` object (``{"image_url": …}``)."""
    if "image_url" in reference:
        return reference["image_url"]
    if "file_id" in reference:
        raise InvalidRequest(
            "input_reference.file_id names an uploaded file, and this server has no Files "
            'API: send the image as a file part, a data: URL or {"image_url": …}',
            param="input_reference.file_id",
        )
    raise InvalidRequest(
        'input_reference must be a file, a URL or an object with an "image_url"',
        param="input_reference",
    )


def parse_audio(raw: dict[str, Any], uploads: list[bytes]) -> AudioCreate:
    """A ``POST /v1/audio/generations`` body; audio models take no input reference."""
    if uploads or "input_reference" in raw:
        raise InvalidRequest("audio models take no input_reference", param="input_reference")
    return parse_generation(raw)


def _no_file(uploads: list[bytes]) -> None:
    if uploads:
        raise InvalidRequest("this endpoint takes no file", param="input_reference")


def parse_speech_body(raw: dict[str, Any], uploads: list[bytes]) -> SpeechCreate:
    """A ``POST /v1/audio/speech`` body (OpenAI text-to-speech)."""
    _no_file(uploads)
    return parse_speech(raw)


def parse_generate_body(raw: dict[str, Any], uploads: list[bytes]) -> AudioGenerate:
    """A ``POST /v1/audio/generate`` body (vLLM-Omni)."""
    _no_file(uploads)
    return parse_generate(raw)
