"""Input references (image-to-video): sniff the bytes, enforce caps, normalize to one PNG.

The content decides the type, never the declared MIME type. Images (PNG, JPEG, WebP) are
decoded with Pillow, videos (MP4/MOV) with PyAV (first frame). The result is resized and
centre-cropped to the job's size, so the worker gets exactly the first frame it needs.
Remote http(s) URLs are fetched only through :mod:`storage.url_guard` (SSRF guard), as
``OMNIQ_INPUTS__URL_FETCH`` allows, and every failure of one reads the same.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging

import av
from PIL import Image

from models.errors import InvalidRequest, OmniqueueError, PayloadTooLarge
from storage.settings import InputSettings, LimitSettings, Settings
from storage.url_guard import URLFetchError, fetch_url

_log = logging.getLogger(__name__)


def sniff(data: bytes) -> str | None:
    """``image/png``, ``image/jpeg``, ``image/webp``, ``video/mp4`` or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    return None


def decode_data_url(url: str, param: str) -> bytes:
    """The bytes of a ``data:`` URL (remote URLs go through :func:`reference_from_url`)."""
    if not url.startswith("data:"):
        raise InvalidRequest(
            f"{param} must be a data: URL or an uploaded file; remote URLs are not fetched",
            param=param,
        )
    try:
        header, payload = url.split(",", 1)
        if header.endswith(";base64"):
            return base64.b64decode(payload, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise InvalidRequest(f"{param} is not a valid base64 data URL", param=param) from exc
    raise InvalidRequest(f"{param} must be a base64 data URL", param=param)


def check_url(url: str, inputs: InputSettings, param: str) -> None:
    """Refuse, before any work, a URL that is neither ``data:`` nor a fetchable http(s)."""
    if url.startswith("data:"):
        return
    if not url.lower().startswith(("http://", "https://")):
        raise InvalidRequest(f"{param} must be an http(s) or data: URL", param=param)
    if inputs.url_fetch == "off":
        raise InvalidRequest(
            f"{param} must be a data: URL or an uploaded file; remote URLs are not fetched "
            "on this server",
            param=param,
        )


def url_fetch_failed(param: str) -> InvalidRequest:
    """The one answer to every refused or failed remote fetch: refused host, closed port,
    HTTP status, too large, slow or not a usable image all read the same to the caller."""
    return InvalidRequest(
        f"{param} could not be fetched as a usable image or video",
        param=param,
        code="url_fetch_failed",
    )


def reference_from_url(url: str, width: int, height: int, settings: Settings, param: str) -> bytes:
    """The width×height PNG first frame behind a ``data:`` or http(s) URL.

    Remote URLs are fetched through :mod:`storage.url_guard` under
    ``settings.inputs.url_fetch``; any failure, decoding included, is
    :func:`url_fetch_failed` (the reason goes to the log only).
    """
    limits, inputs = settings.limits, settings.inputs
    check_url(url, inputs, param)
    if url.startswith("data:"):
        return reference_frame_png(decode_data_url(url, param), width, height, limits, param)
    assert inputs.url_fetch != "off"
    try:
        data = fetch_url(
            url,
            max_bytes=limits.max_upload_bytes,
            timeout_s=inputs.url_fetch_timeout_s,
            policy=inputs.url_fetch,
            max_redirects=inputs.url_fetch_max_redirects,
            headers={"Accept": "image/*, video/*"},
        )
        return reference_frame_png(data, width, height, limits, param)
    except (URLFetchError, OmniqueueError) as exc:
        _log.info("%s: remote reference refused or failed: %s", param, exc)
        raise url_fetch_failed(param) from None
    except Exception:  # a decoder choking on fetched bytes must not answer differently
        _log.warning("%s: remote reference failed unexpectedly", param, exc_info=True)
        raise url_fetch_failed(param) from None


def reference_frame_png(
    data: bytes, width: int, height: int, limits: LimitSettings, param: str
) -> bytes:
    """Decode ``data`` (image or video), check caps, return a width×height RGB PNG."""
    if len(data) > limits.max_upload_bytes:
        raise PayloadTooLarge(
            f"{param} is larger than {limits.max_upload_bytes} bytes", param=param
        )
    kind = sniff(data)
    if kind is None:
        raise InvalidRequest(
            f"{param} is not a PNG, JPEG, WebP image or an MP4 video",
            param=param,
            code="unsupported_media",
        )
    image = (
        _decode_video(data, limits, param)
        if kind == "video/mp4"
        else _decode_image(data, limits, param)
    )
    out = io.BytesIO()
    _cover(image.convert("RGB"), width, height).save(out, format="PNG")
    return out.getvalue()


def _decode_image(data: bytes, limits: LimitSettings, param: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as probe:
            w, h = probe.size
            if w * h > limits.max_reference_pixels:
                raise PayloadTooLarge(
                    f"{param} has {w}x{h} pixels, more than {limits.max_reference_pixels}",
                    param=param,
                )
            probe.load()
            return probe.copy()
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(f"{param} could not be decoded as an image", param=param) from exc


def _decode_video(data: bytes, limits: LimitSettings, param: str) -> Image.Image:
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise InvalidRequest(f"{param} has no video stream", param=param)
            stream = container.streams.video[0]
            w, h = stream.codec_context.width, stream.codec_context.height
            if w * h > limits.max_reference_pixels:
                raise PayloadTooLarge(
                    f"{param} has {w}x{h} pixels, more than {limits.max_reference_pixels}",
                    param=param,
                )
            if container.duration is not None:
                seconds = container.duration / av.time_base
                if seconds > limits.max_reference_seconds:
                    raise PayloadTooLarge(
                        f"{param} lasts {seconds:.1f} s, more than "
                        f"{limits.max_reference_seconds:g} s",
                        param=param,
                    )
            for frame in container.decode(stream):
                image: Image.Image = frame.to_image()
                return image
    except av.FFmpegError as exc:
        raise InvalidRequest(f"{param} could not be decoded as a video", param=param) from exc
    raise InvalidRequest(f"{param} has no decodable frame", param=param)


def _cover(image: Image.Image, width: int, height: int) -> Image.Image:
    """Resize to cover width×height, then centre-crop."""
    scale = max(width / image.width, height / image.height)
    w, h = max(width, round(image.width * scale)), max(height, round(image.height * scale))
    resized = image.resize((w, h), Image.Resampling.LANCZOS)
    left, top = (w - width) // 2, (h - height) // 2
    return resized.crop((left, top, left + width, top + height))
