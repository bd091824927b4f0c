"""Audio artifacts (WAV, MP3, FLAC, Opus, AAC, PCM) with PyAV, checked by decoding them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.audio import AUDIO_FORMATS, SAMPLE_RATES
from workers.media.audio import (
    AudioOut,
    decode_audio,
    encode_audio,
    output_rate,
    pcm16,
    prepare_audio,
)

AAC_SLACK = 2048  # ADTS cannot signal the encoder's priming samples (see workers/audio_media)


def _tone(seconds: float, rate: int, channels: int) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    left = 0.4 * np.sin(2 * np.pi * 440 * t)
    right = 0.3 * np.sin(2 * np.pi * 660 * t)
    return np.stack([left, right][:channels]).astype(np.float32)


@pytest.mark.parametrize("fmt", [f for f in AUDIO_FORMATS if f != "pcm"])
@pytest.mark.parametrize(("rate", "channels"), [(24_000, 1), (44_100, 2)])
def test_every_format_decodes_to_the_right_duration(
    fmt: str, rate: int, channels: int, tmp_path: Path
) -> None:
    out = prepare_audio(_tone(1.25, rate, channels), rate, rate=output_rate(fmt, rate))
    path = tmp_path / f"clip.{fmt}"
    assert encode_audio(out, fmt, path) == path.stat().st_size > 0
    decoded, decoded_rate = decode_audio(path)
    assert decoded.shape[0] == channels
    n = decoded.shape[1] * out.sample_rate / decoded_rate  # Opus always decodes at 48 kHz
    if fmt == "aac":
        assert out.num_samples <= n <= out.num_samples + AAC_SLACK
    else:
        assert n == out.num_samples
    assert abs(n / out.sample_rate - 1.25) <= (AAC_SLACK / out.sample_rate if fmt == "aac" else 0)
    if fmt in ("wav", "flac"):  # lossless up to 16-bit quantization
        assert np.abs(decoded - out.samples).max() <= 1 / 32767


def test_lossy_formats_keep_the_signal(tmp_path: Path) -> None:
    out = prepare_audio(_tone(1.0, 48_000, 2), 48_000, rate=48_000)
    for fmt in ("mp3", "opus", "aac"):
        path = tmp_path / f"clip.{fmt}"
        encode_audio(out, fmt, path)
        decoded, _ = decode_audio(path)
        # The loudest channel keeps its level (0.4 peak sine, RMS 0.28).
        rms = np.sqrt((decoded[0, 4800:-4800] ** 2).mean())
        assert 0.24 < rms < 0.32, (fmt, rms)


def test_pcm_is_raw_interleaved_s16le(tmp_path: Path) -> None:
    samples = np.array([[0.0, 0.5, -1.0], [1.0, -0.5, 0.25]], dtype=np.float32)
    out = AudioOut(samples, 8000)
    path = tmp_path / "clip.pcm"
    encode_audio(out, "pcm", path)
    ints = np.frombuffer(path.read_bytes(), dtype="<i2")
    assert ints.tolist() == [0, 32767, 16384, -16384, -32767, 8192]
    assert pcm16(out, 1, 2) == path.read_bytes()[4:8]


def test_prepare_converts_rate_channels_and_length() -> None:
    stereo = _tone(0.5, 44_100, 2)
    mono = prepare_audio(stereo, 44_100, rate=24_000, channels=1)
    assert (mono.channels, mono.num_samples, mono.sample_rate) == (1, 12_000, 24_000)
    assert mono.duration_s == 0.5
    up = prepare_audio(stereo[:1], 44_100, rate=44_100, channels=2)
    assert np.array_equal(up.samples[0], up.samples[1])
    same = prepare_audio(stereo, 44_100, rate=44_100)
    assert np.array_equal(same.samples, stereo)
    # A model's odd native rate still makes every format (tiny test models run at 8 Hz).
    tiny = prepare_audio(np.zeros((2, 12), np.float32), 8, rate=output_rate("mp3", 8))
    assert (tiny.sample_rate, tiny.num_samples) == (8000, 12_000)
    with pytest.raises(ValueError, match="channels"):
        prepare_audio(np.zeros((3, 10), np.float32), 8000, rate=8000)


def test_output_rate_follows_each_codec() -> None:
    assert output_rate("wav", 8) == 8
    assert output_rate("pcm", 44_100, 16_000) == 16_000
    assert output_rate("mp3", 44_100) == 44_100
    assert output_rate("opus", 44_100) == 48_000
    assert output_rate("opus", 22_050) == 24_000
    assert output_rate("aac", 8) == 7350
    for fmt, rates in SAMPLE_RATES.items():
        if rates is not None:
            assert output_rate(fmt, 30_000) in rates
    with pytest.raises(ValueError, match="cannot encode"):
        encode_audio(AudioOut(np.zeros((1, 10), np.float32), 44_100), "opus", "/dev/null")
