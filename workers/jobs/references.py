"""A job's stored keyframes and omni-references (``VideoSpec.references``), fetched and
decoded for its adapter: images to uint8 H×W×3, videos to uint8 T×H×W×3 at their own
frame rate (turned upright as a player shows them) with their soundtrack, audio clips to
float32 (channels, samples) at their own rate. The API checked each one before storing
it (api/references.py); what could not be decoded now fails the job as a bad input."""

from __future__ import annotations

import io
from collections.abc import Callable

import av
import numpy as np
from PIL import Image

from models.errors import InvalidJobInput
from models.job_specs import ReferenceInput
from workers.media.audio import decode_audio
from workers.pipelines.base import MediaReference


def load_references(
    items: list[ReferenceInput], fetch: Callable[[str], bytes]
) -> tuple[np.ndarray | None, np.ndarray | None, list[MediaReference]]:
    """(first keyframe, last keyframe, ordered references) of a job."""
    first = last = None
    refs: list[MediaReference] = []
    for i, item in enumerate(items):
        ref = decode_reference(item.kind, fetch(item.key), f"input_references[{i}]")
        if item.frame_index is None:
            refs.append(ref)
        elif item.frame_index == 0:
            first = ref.frames
        else:
            last = ref.frames
    return first, last, refs


def decode_reference(kind: str, data: bytes, param: str) -> MediaReference:
    try:
        if kind == "image":
            with Image.open(io.BytesIO(data)) as img:
                return MediaReference(kind="image", frames=np.asarray(img.convert("RGB")))
        if kind == "audio":
            audio, rate = decode_audio(io.BytesIO(data))
            return MediaReference(kind="audio", audio=audio, sample_rate=rate)
        with av.open(io.BytesIO(data), mode="r") as container:
            return _video(container, data)
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise InvalidJobInput(f"{param} could not be decoded", param=param) from exc


def _video(container: av.container.InputContainer, data: bytes) -> MediaReference:
    stream = container.streams.video[0]
    frames, rotation = [], 0.0
    for frame in container.decode(stream):
        rotation = frame.rotation
        frames.append(frame.to_ndarray(format="rgb24"))
    if not frames:
        raise ValueError("no video frames")
    fps = float(stream.average_rate or stream.guessed_rate or 24)
    video = np.stack(frames)
    turns = round(rotation / 90.0) % 4
    if turns:
        video = np.ascontiguousarray(np.rot90(video, k=-turns, axes=(1, 2)))
    audio = rate = None
    if container.streams.audio:  # its soundtrack, decoded as audio jobs' files are
        audio, rate = decode_audio(io.BytesIO(data))
    return MediaReference(kind="video", frames=video, fps=fps, audio=audio, sample_rate=rate)
