"""PCM16 ``chunk`` events of an audio job published while its steps make the clip.

An adapter whose steps make audio piece by piece (``SupportsAudioPieces.take_audio``, e.g.
``reference/speech``) hands each piece to a :class:`PcmStream` after the step. The stream
converts it to the artifact's channels and rate (one stateful swresample resampler for the
whole clip, so the pieces join without seams), publishes it in chunks of at most 100 ms,
and keeps it: :meth:`PcmStream.finish` returns the streamed samples as the
:class:`AudioOut` the executor encodes, so the file holds exactly what was streamed.

An adapter whose decode makes the clip window by window (:class:`SupportsAudioDecodeStream`,
e.g. LongCat-AudioDiT) hands the stream its windows the same way, after the steps:
:meth:`PcmStream.decode` publishes each before the next one decodes and returns the
windows joined as the decoded :class:`Media`.

While pieces come in, no more than ``floor(samples in × rate out / rate in)`` samples are
published, so the clip's final length, ``round(n × rate out / rate in)`` as
:func:`workers.media.audio.prepare_audio` makes it, is never exceeded: the flush at
:meth:`finish` pads or trims only the unpublished tail.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import av
import numpy as np

from models.events import ChunkEvent
from models.job_specs import AudioSpec
from workers.media.audio import AudioOut, output_rate, pcm16
from workers.media.frames import Media

_LAYOUTS = {1: "mono", 2: "stereo"}


class _Publisher(Protocol):
    def publish(self, event: ChunkEvent, data: bytes | None = None) -> str | None: ...


@runtime_checkable
class SupportsAudioDecodeStream(Protocol):
    """A job adapter that decodes its clip in windows, in order (a capability of
    ``workers/pipelines/base.py``'s adapters, declared here, below them, so that the
    stream can name it): a job that streams PCM gets each window's chunks while the next
    decodes. The windows joined are the job's audio (an adapter says how near they are
    to its ``decode``)."""

    def decode_audio_stream(self, state: Any) -> Iterator[tuple[np.ndarray, int]] | None:
        """Each window as float32 (channels, n) and its sample rate, decoded when asked
        for; None where this job cannot (the executor then calls ``decode``)."""
        ...


class PcmStream:
    """The PCM stream of one job run (``spec.stream_pcm``)."""

    def __init__(self, run: _Publisher, spec: AudioSpec) -> None:
        self.run = run
        self.spec = spec
        self.rate_in = 0
        self.rate = 0
        self.channels = 0
        self.n_in = 0
        self.parts: list[np.ndarray] = []  # float32 (channels, k) at ``rate``
        self.made = 0  # samples in ``parts``
        self.published = 0
        self.seq = 0
        self._resampler: av.AudioResampler | None = None

    @property
    def started(self) -> bool:
        return self.rate_in > 0

    def feed(self, piece: tuple[np.ndarray, int] | None) -> None:
        """Convert, keep and publish a piece from ``take_audio`` (None or empty: nothing)."""
        if piece is None:
            return
        audio, rate_in = piece
        if not self.started:
            self.rate_in = rate_in
            self.rate = output_rate(self.spec.response_format, rate_in, self.spec.sample_rate)
            self.channels = self.spec.channels or int(audio.shape[0])
            if self.rate != rate_in:
                layout = _LAYOUTS[self.channels]
                self._resampler = av.AudioResampler(format="fltp", layout=layout, rate=self.rate)
        elif rate_in != self.rate_in:
            raise RuntimeError(f"audio pieces changed rate: {self.rate_in} → {rate_in} Hz")
        if audio.shape[1] == 0:
            return
        x = _channels(audio, self.channels)
        if self._resampler is not None:
            frame = av.AudioFrame.from_ndarray(x, format="fltp", layout=_LAYOUTS[self.channels])
            frame.sample_rate = self.rate_in
            frame.pts = self.n_in
            frame.time_base = Fraction(1, self.rate_in)
            x = _joined([f.to_ndarray() for f in self._resampler.resample(frame)], self.channels)
        self.n_in += audio.shape[1]
        self._keep(x)
        self._publish(self.n_in * self.rate // self.rate_in)

    def decode(self, pieces: Iterator[tuple[np.ndarray, int]]) -> Media:
        """Feed each decoded window as it comes (published before the next decodes); the
        windows joined, as the decode's audio-only media (for :meth:`finish`)."""
        kept: list[np.ndarray] = []
        rate = 0
        for audio, rate in pieces:
            self.feed((audio, rate))
            kept.append(audio.astype(np.float32, copy=False))
        if not kept:
            raise RuntimeError("the decode stream made no audio")
        return Media.audio_only(np.ascontiguousarray(np.concatenate(kept, axis=1)), rate)

    def finish(self, audio: np.ndarray, sample_rate: int) -> AudioOut:
        """The whole clip, as streamed, once decode returned ``audio`` (which must be the
        pieces joined); publishes the rest."""
        if sample_rate != self.rate_in or audio.shape[1] != self.n_in:
            raise RuntimeError(
                f"decode made {audio.shape[1]} samples at {sample_rate} Hz, but the steps "
                f"handed out {self.n_in} at {self.rate_in} Hz"
            )
        if self._resampler is not None:
            self._keep(
                _joined([f.to_ndarray() for f in self._resampler.resample(None)], self.channels)
            )
        n_out = round(self.n_in * self.rate / self.rate_in)
        clip = _joined(self.parts, self.channels)[:, :n_out]
        if clip.shape[1] < n_out:
            pad = np.zeros((self.channels, n_out - clip.shape[1]), np.float32)
            clip = np.concatenate([clip, pad], axis=1)
        self.parts, self.made = [clip], n_out
        self._publish(n_out)
        return AudioOut(np.ascontiguousarray(clip), self.rate)

    def _keep(self, x: np.ndarray) -> None:
        if x.shape[1]:
            self.parts.append(np.clip(x, -1.0, 1.0).astype(np.float32, copy=False))
            self.made += x.shape[1]

    def _publish(self, limit: int) -> None:
        """Publish samples up to ``min(limit, made)`` in chunks of at most 100 ms."""
        stop = min(limit, self.made)
        if stop <= self.published:
            return
        clip = AudioOut(_joined(self.parts, self.channels), self.rate)
        self.parts = [clip.samples]  # one array from here on: the next join is cheap
        size = max(1, self.rate // 10)
        for start in range(self.published, stop, size):
            end = min(stop, start + size)
            data = pcm16(clip, start, end)
            self.run.publish(
                ChunkEvent(seq=self.seq, byte_length=len(data), num_frames=end - start), data
            )
            self.seq += 1
        self.published = stop


def _channels(audio: np.ndarray, channels: int) -> np.ndarray:
    x = np.nan_to_num(audio.astype(np.float32, copy=False))
    if channels == 1 and x.shape[0] == 2:
        x = x.mean(axis=0, keepdims=True)
    elif channels == 2 and x.shape[0] == 1:
        x = np.repeat(x, 2, axis=0)
    return np.ascontiguousarray(x)


def _joined(parts: list[np.ndarray], channels: int) -> np.ndarray:
    if not parts:
        return np.zeros((channels, 0), np.float32)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
