"""The output contract checked on every encoded video (workers/jobs/output_check.py): real
MP4s written by encode_mp4, each promise broken once."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from models.errors import ErrorCode, OutputInvalid
from workers.common.failures import classify
from workers.jobs.output_check import Expected, check_mp4
from workers.media.mp4 import encode_mp4
from workers.pipelines.base import Media

W, H, N, FPS, RATE = 64, 32, 30, 24.0, 32000


def _media(audio: np.ndarray | None) -> Media:
    frames = np.random.default_rng(0).integers(0, 256, (N, H, W, 3), dtype=np.uint8)
    return Media(frames=frames, fps=FPS, audio=audio, sample_rate=RATE)


def _tone(channels: int = 2, level: float = 0.2) -> np.ndarray:
    t = np.arange(round(N / FPS * RATE), dtype=np.float32) / RATE
    return np.repeat((level * np.sin(2 * np.pi * 440 * t))[None], channels, 0)


@pytest.fixture
def mp4(tmp_path: Path) -> Path:
    path = tmp_path / "video.mp4"
    encode_mp4(_media(_tone()), path)
    return path


def test_a_conforming_file_passes(mp4: Path) -> None:
    check_mp4(mp4, Expected(W, H, FPS, N, audio=True))


@pytest.mark.parametrize(
    ("expected", "says"),
    [
        (Expected(W * 2, H, FPS, N, True), "is 64x32, not 128x32"),
        (Expected(W, H, 30.0, N, True), "not 30"),
        (Expected(W, H, FPS, N + 5, True), f"has {N} frames, not {N + 5}"),
    ],
)
def test_each_broken_promise_is_named(mp4: Path, expected: Expected, says: str) -> None:
    with pytest.raises(OutputInvalid, match=says):
        check_mp4(mp4, expected)


def test_silent_or_missing_audio_fails_as_output_invalid(tmp_path: Path) -> None:
    silent = tmp_path / "silent.mp4"
    encode_mp4(_media(np.zeros((2, round(N / FPS * RATE)), np.float32)), silent)
    with pytest.raises(OutputInvalid, match="silent") as err:
        check_mp4(silent, Expected(W, H, FPS, N, audio=True))
    assert classify(err.value) == (ErrorCode.OUTPUT_INVALID, str(err.value))
    mute = tmp_path / "mute.mp4"
    encode_mp4(_media(None), mute)
    check_mp4(mute, Expected(W, H, FPS, N, audio=False))
    with pytest.raises(OutputInvalid, match="no audio stream"):
        check_mp4(mute, Expected(W, H, FPS, N, audio=True))


def test_a_foreign_video_codec_fails(tmp_path: Path) -> None:
    path = tmp_path / "mpeg4.mp4"
    with av.open(str(path), "w", format="mp4") as out:
        video = out.add_stream("mpeg4", rate=24)
        video.width, video.height, video.pix_fmt = W, H, "yuv420p"
        for i in range(N):
            frame = av.VideoFrame.from_ndarray(np.full((H, W, 3), i, np.uint8), format="rgb24")
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
    with pytest.raises(OutputInvalid, match="mpeg4, not h264"):
        check_mp4(path, Expected(W, H, FPS, N, audio=False))
