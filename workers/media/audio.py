"""Audio artifacts with PyAV (no ffmpeg CLI): WAV, MP3, FLAC, Opus, AAC and raw PCM.

Everything goes through one shape: :class:`AudioOut`, float32 ``(channels, samples)`` in
[-1, 1] at the rate and channel count of the artifact. :func:`prepare_audio` makes it from
a pipeline's output (downmix/upmix, resample with PyAV's swresample, exact length), so the
PCM chunks streamed while a job runs and every encoded file hold the same samples.

Containers and codecs:

==========  ==========================================  =====================================
format      bytes                                       sample rates
==========  ==========================================  =====================================
``wav``     RIFF/WAVE, PCM s16le                        any
``pcm``     raw PCM s16le, channels interleaved         any (no header: see the job object)
``flac``    native FLAC (s16)                           any up to 655350 Hz
``mp3``     MPEG-1/2 layer III (libmp3lame), LAME tag   8, 11.025, 12, 16, 22.05, 24, 32,
            with encoder delay and padding (gapless)    44.1, 48 kHz
``opus``    Ogg Opus (libopus); pre-skip and the last   8, 12, 16, 24, 48 kHz
            granule trim the codec delay exactly
``aac``     ADTS (what ``.aac`` files and OpenAI's      7.35 … 96 kHz (the MPEG-4 table)
            ``aac`` responses are: no container)
==========  ==========================================  =====================================

ADTS has no field for the encoder's priming samples, so an AAC file decodes up to two AAC
frames (2048 samples) longer than the input; every other format decodes to exactly the
encoded number of samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO, cast

import av
import numpy as np
from av.audio.stream import AudioStream

from models.audio import AUDIO_FORMATS, EXTENSIONS, MEDIA_TYPES, SAMPLE_RATES

__all__ = [
    "EXTENSIONS",
    "FORMATS",
    "MEDIA_TYPES",
    "AudioOut",
    "decode_audio",
    "encode_audio",
    "output_rate",
    "pcm16",
    "prepare_audio",
]

FORMATS = AUDIO_FORMATS
MAX_FLAC_RATE = 655_350
_CODECS = {"mp3": ("mp3", "libmp3lame"), "opus": ("ogg", "libopus"), "aac": ("adts", "aac"),
           "flac": ("flac", "flac"), "wav": ("wav", "pcm_s16le")}  # fmt: skip
_LAYOUTS = {1: "mono", 2: "stereo"}


@dataclass(frozen=True)
class AudioOut:
    """The samples of an artifact: float32 (channels, n) in [-1, 1] at ``sample_rate``."""

    samples: np.ndarray
    sample_rate: int

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.samples.shape[1])

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sample_rate


def output_rate(fmt: str, native: int, requested: int | None = None) -> int:
    """The artifact's sample rate: the requested one, else the native rate when the format
    takes it, else the nearest rate the format takes (the next higher one on a tie)."""
    allowed = SAMPLE_RATES[fmt]
    rate = requested or native
    if allowed is None:
        return min(rate, MAX_FLAC_RATE) if fmt == "flac" else rate
    if rate in allowed:
        return rate
    return min(allowed, key=lambda r: (abs(r - rate), -r))


def prepare_audio(
    audio: np.ndarray, sample_rate: int, *, rate: int, channels: int | None = None
) -> AudioOut:
    """Convert a pipeline's float audio (channels, n) to ``rate`` Hz and ``channels``
    (None: keep; mono is averaged from stereo, stereo duplicated from mono). The result
    has exactly ``round(n * rate / sample_rate)`` samples."""
    if audio.ndim != 2 or audio.shape[0] not in (1, 2):
        raise ValueError(f"audio must be (channels, samples) with 1 or 2 channels: {audio.shape}")
    if sample_rate <= 0 or rate <= 0:
        raise ValueError("sample rates must be positive")
    x = np.clip(np.nan_to_num(audio.astype(np.float32, copy=False)), -1.0, 1.0)
    want = channels or x.shape[0]
    if want not in _LAYOUTS:
        raise ValueError(f"channels must be 1 or 2, got {want}")
    if want == 1 and x.shape[0] == 2:
        x = x.mean(axis=0, keepdims=True)
    elif want == 2 and x.shape[0] == 1:
        x = np.repeat(x, 2, axis=0)
    n_out = round(x.shape[1] * rate / sample_rate)
    if rate != sample_rate and x.shape[1]:
        x = _resample(x, sample_rate, rate)
    return AudioOut(np.ascontiguousarray(_fit(x, n_out), dtype=np.float32), rate)


def pcm16(audio: AudioOut, start: int = 0, stop: int | None = None) -> bytes:
    """Samples ``[start, stop)`` as little-endian int16, channels interleaved."""
    part = audio.samples[:, start:stop]
    ints = np.round(part.T * 32767.0).astype("<i2")
    return ints.tobytes()


def encode_audio(audio: AudioOut, fmt: str, path: str | Path) -> int:
    """Write ``audio`` as ``fmt`` at ``path``; returns the bytes written."""
    out = Path(path)
    if fmt == "pcm":
        out.write_bytes(pcm16(audio))
        return out.stat().st_size
    if fmt not in _CODECS:
        raise ValueError(f"unknown audio format {fmt!r} (known: {', '.join(FORMATS)})")
    allowed = SAMPLE_RATES[fmt]
    if allowed is not None and audio.sample_rate not in allowed:
        raise ValueError(f"{fmt} cannot encode {audio.sample_rate} Hz")
    container_format, codec = _CODECS[fmt]
    layout = _LAYOUTS[audio.channels]
    with av.open(str(out), mode="w", format=container_format) as container:
        stream = cast(AudioStream, container.add_stream(codec, rate=audio.sample_rate))
        stream.layout = layout
        stream.time_base = Fraction(1, audio.sample_rate)
        if fmt in ("wav", "flac"):
            stream.format = "s16"
        if fmt == "mp3":
            stream.bit_rate = 128_000 if audio.channels == 2 else 64_000
        # Frames of the codec's size (1024 for AAC, 1152 for MP3, 20 ms for Opus); the
        # encoder's own FIFO re-frames anything else.
        size = stream.codec_context.frame_size or 4096
        fmt_in = "fltp"
        for offset in range(0, audio.num_samples, size):
            chunk = np.ascontiguousarray(audio.samples[:, offset : offset + size])
            frame = av.AudioFrame.from_ndarray(chunk, format=fmt_in, layout=layout)
            frame.sample_rate = audio.sample_rate
            frame.pts = offset
            frame.time_base = Fraction(1, audio.sample_rate)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.stat().st_size


def decode_audio(source: str | Path | BinaryIO) -> tuple[np.ndarray, int]:
    """Decode any of the formats but ``pcm`` back to float32 (channels, n) and its rate."""
    with av.open(source if not isinstance(source, Path) else str(source), mode="r") as container:
        stream = container.streams.audio[0]
        chunks = [
            f.to_ndarray().reshape(f.layout.nb_channels, -1)
            if f.format.is_planar
            else f.to_ndarray().reshape(-1, f.layout.nb_channels).T
            for f in container.decode(stream)
        ]
        rate = int(stream.codec_context.sample_rate)
    data = np.concatenate(chunks, axis=1) if chunks else np.zeros((1, 0), np.float32)
    if data.dtype == np.int16:
        return data.astype(np.float32) / 32768.0, rate
    if data.dtype == np.int32:
        return data.astype(np.float32) / 2**31, rate
    return data.astype(np.float32), rate


def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    layout = _LAYOUTS[x.shape[0]]
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=dst)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x), format="fltp", layout=layout)
    frame.sample_rate = src
    frame.pts = 0
    frame.time_base = Fraction(1, src)
    out = [f.to_ndarray() for f in resampler.resample(frame)]
    out += [f.to_ndarray() for f in resampler.resample(None)]
    return np.concatenate(out, axis=1) if out else np.zeros((x.shape[0], 0), np.float32)


def _fit(x: np.ndarray, n: int) -> np.ndarray:
    """Pad with silence or trim to exactly ``n`` samples."""
    if x.shape[1] >= n:
        return x[:, :n]
    return np.concatenate([x, np.zeros((x.shape[0], n - x.shape[1]), np.float32)], axis=1)
