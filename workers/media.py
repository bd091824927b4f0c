"""Media encoding with PyAV (no ffmpeg CLI): final MP4 artifacts and JPEG thumbnails.

``encode_mp4`` writes H.264 (libx264, ``yuv420p``) video at an exact frame rate, frame
count and size, plus AAC stereo audio when the media has sound, with the ``moov`` atom
moved to the front (``+faststart``) so players can start before the download ends.
Audio is padded or trimmed to the video duration; the AAC encoder pads its last
1024-sample frame, so the audio track ends within one AAC frame of the video.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.audio.stream import AudioStream
from av.container import OutputContainer
from PIL import Image

from workers.pipelines.base import Media

AAC_FRAME_SIZE = 1024
DEFAULT_SAMPLE_RATE = 48_000


@dataclass(frozen=True)
class EncodedInfo:
    """What :func:`encode_mp4` wrote."""

    path: Path
    bytes: int
    width: int
    height: int
    num_frames: int
    fps: float
    duration_s: float
    has_audio: bool


def encode_mp4(
    media: Media, path: str | Path, *, crf: int = 23, preset: str = "veryfast"
) -> EncodedInfo:
    """Encode ``media`` to an H.264/AAC MP4 at ``path`` (width and height must be even)."""
    frames = _check_frames(media.frames)
    num_frames, height, width = frames.shape[:3]
    if media.fps <= 0:
        raise ValueError(f"fps must be positive, got {media.fps}")
    rate = Fraction(media.fps).limit_denominator(1001)
    sample_rate = media.sample_rate or DEFAULT_SAMPLE_RATE
    audio = None
    if media.audio is not None:
        n_samples = round(num_frames / rate * sample_rate)
        audio = _fit_audio(_check_audio(media.audio), n_samples)
    out = Path(path)

    with av.open(
        str(out), mode="w", format="mp4", container_options={"movflags": "+faststart"}
    ) as container:
        video = container.add_stream("libx264", rate=rate)
        video.width = width
        video.height = height
        video.pix_fmt = "yuv420p"
        video.time_base = 1 / rate
        video.options = {"crf": str(crf), "preset": preset}
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate)
            sound.layout = "stereo"
            sound.time_base = Fraction(1, sample_rate)

        fed = 0  # audio samples handed to the encoder so far
        for index in range(num_frames):
            frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
            frame.pts = index
            container.mux(video.encode(frame))
            if sound is not None and audio is not None:
                # Interleave: feed audio up to the end of this video frame.
                until = min(audio.shape[1], round((index + 1) / rate * sample_rate))
                fed = _feed_audio(container, sound, audio, fed, until)
        container.mux(video.encode(None))
        if sound is not None and audio is not None:
            _feed_audio(container, sound, audio, fed, audio.shape[1])
            container.mux(sound.encode(None))  # flushes the resampler FIFO and the encoder

    return EncodedInfo(
        path=out,
        bytes=out.stat().st_size,
        width=width,
        height=height,
        num_frames=num_frames,
        fps=float(rate),
        duration_s=float(num_frames / rate),
        has_audio=audio is not None,
    )


def encode_thumbnail(
    frame: np.ndarray, path: str | Path, *, max_side: int = 512, quality: int = 85
) -> int:
    """Write ``frame`` (uint8 H×W×3) as a JPEG whose longer side is ≤ ``max_side``."""
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"thumbnail frame must be uint8 H×W×3, got {frame.dtype} {frame.shape}")
    if max_side < 1:
        raise ValueError("max_side must be >= 1")
    image = Image.fromarray(frame)
    image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    out = Path(path)
    image.save(out, format="JPEG", quality=quality, optimize=True)
    return out.stat().st_size


def _check_frames(frames: np.ndarray) -> np.ndarray:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(f"frames must be uint8 T×H×W×3, got {frames.dtype} {frames.shape}")
    num_frames, height, width = frames.shape[:3]
    if num_frames < 1:
        raise ValueError("cannot encode zero frames")
    if width % 2 or height % 2:
        raise ValueError(f"yuv420p needs even width and height, got {width}x{height}")
    return np.ascontiguousarray(frames)


def _check_audio(audio: np.ndarray) -> np.ndarray:
    """Return float32 (2, n) audio; mono is duplicated to both channels."""
    if audio.ndim != 2 or audio.shape[0] not in (1, 2):
        raise ValueError(f"audio must be (channels, samples) with 1 or 2 channels: {audio.shape}")
    if audio.shape[0] == 1:
        audio = np.repeat(audio, 2, axis=0)
    return np.clip(audio.astype(np.float32, copy=False), -1.0, 1.0)


def _fit_audio(audio: np.ndarray, n_samples: int) -> np.ndarray:
    """Pad with silence or trim ``audio`` to exactly ``n_samples``."""
    if audio.shape[1] >= n_samples:
        return np.ascontiguousarray(audio[:, :n_samples])
    pad = np.zeros((2, n_samples - audio.shape[1]), dtype=np.float32)
    return np.concatenate([audio, pad], axis=1)


def _feed_audio(
    container: OutputContainer,
    stream: AudioStream,
    audio: np.ndarray,
    start: int,
    stop: int,
) -> int:
    """Encode ``audio[:, start:stop]`` in AAC-sized frames; return the new offset."""
    sample_rate = stream.codec_context.sample_rate
    for offset in range(start, stop, AAC_FRAME_SIZE):
        chunk = np.ascontiguousarray(audio[:, offset : min(offset + AAC_FRAME_SIZE, stop)])
        frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
        frame.sample_rate = sample_rate
        frame.pts = offset
        frame.time_base = Fraction(1, sample_rate)
        container.mux(stream.encode(frame))
    return max(start, stop)


def remux_faststart(src: str | Path, dst: str | Path) -> int:
    """Copy the video packets of ``src`` (e.g. a fragmented MP4 of a streamed session)
    into a progressive MP4 with the ``moov`` atom first; no re-encode. Returns the bytes
    written."""
    with (
        av.open(str(src)) as inp,
        av.open(str(dst), "w", format="mp4", options={"movflags": "+faststart"}) as out,
    ):
        source = inp.streams.video[0]
        target = out.add_stream_from_template(source)
        for packet in inp.demux(source):
            if packet.dts is None:  # the demuxer's flush packet
                continue
            packet.stream = target
            out.mux(packet)
    return Path(dst).stat().st_size
