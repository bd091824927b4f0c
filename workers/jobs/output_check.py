"""The output contract of a video job, checked on the encoded file before it is uploaded.

After encoding, the worker opens the MP4 with PyAV and checks what the client was
promised: an H.264 stream at the job's size and frame rate, as long as the job's frames
(within one frame), and, when the model made sound, an AAC stream with two channels that
is not silent (RMS above ``SILENCE_RMS``). A violation fails the job with
``output_invalid`` and a message that says which promise broke; nothing is uploaded.

It costs a demux of the video (no decode) and a decode of the audio: a few milliseconds
for a 15 s clip, so it runs on every job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from models.errors import OutputInvalid
from models.job_specs import VideoSpec

# -80 dBFS: far below any real soundtrack, far above a stream of encoded zeros.
SILENCE_RMS = 1e-4


@dataclass(frozen=True)
class Expected:
    """What the job asked for."""

    width: int
    height: int
    fps: float
    num_frames: int
    audio: bool

    @classmethod
    def of(cls, spec: VideoSpec, *, audio: bool) -> Expected:
        """A video job's contract; ``audio``: the adapter returned a soundtrack."""
        return cls(spec.width, spec.height, spec.fps, spec.num_frames, audio)


def check_mp4(path: Path, expected: Expected) -> None:
    """Raise :class:`OutputInvalid` unless ``path`` keeps the contract of ``expected``."""
    with av.open(str(path)) as container:
        if not container.streams.video:
            raise OutputInvalid("the MP4 has no video stream")
        video = container.streams.video[0]
        _check_video(container, video, expected)
        if expected.audio:
            if not container.streams.audio:
                raise OutputInvalid("the MP4 has no audio stream, but the model made sound")
            _check_audio(container, container.streams.audio[0])


def _check_video(
    container: av.container.InputContainer, video: av.VideoStream, e: Expected
) -> None:
    name = video.codec_context.name
    if name != "h264":
        raise OutputInvalid(f"the video stream is {name}, not h264")
    size = (video.codec_context.width, video.codec_context.height)
    if size != (e.width, e.height):
        raise OutputInvalid(f"the video is {size[0]}x{size[1]}, not {e.width}x{e.height}")
    rate = video.average_rate or video.guessed_rate
    want = Fraction(e.fps).limit_denominator(1001)
    if rate is None or abs(float(rate) - float(want)) > 1e-3:
        raise OutputInvalid(f"the video runs at {rate} fps, not {float(want):g}")
    frames = sum(1 for packet in container.demux(video) if packet.size)
    if abs(frames - e.num_frames) > 1:
        raise OutputInvalid(f"the video has {frames} frames, not {e.num_frames}")
    container.seek(0)


def _check_audio(container: av.container.InputContainer, audio: av.AudioStream) -> None:
    name = audio.codec_context.name
    if name != "aac":
        raise OutputInvalid(f"the audio stream is {name}, not aac")
    channels = audio.codec_context.channels
    if channels != 2:
        raise OutputInvalid(f"the audio has {channels} channel(s), not 2")
    squares, count = 0.0, 0
    for frame in container.decode(audio):
        samples = frame.to_ndarray().astype(np.float64)
        squares += float(np.square(samples).sum())
        count += samples.size
    rms = math.sqrt(squares / count) if count else 0.0
    if rms <= SILENCE_RMS:
        raise OutputInvalid(f"the audio is silent (RMS {rms:.2e})")
