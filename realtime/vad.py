"""Server VAD: silero-vad on a streaming PCM16 input, as ``speech_started`` / ``speech_stopped``.

One :class:`SileroVAD` per session input stream. ``feed`` takes PCM16 LE mono of any
length, resamples it to 16 kHz with a stateful polyphase FIR (exact time alignment: output
sample ``m`` sits at input time ``m * rate / 16000``), cuts 32 ms frames (512 samples) and
asks silero for a speech probability per frame. The decision rule is silero's own
``VADIterator`` hysteresis, with OpenAI's server-VAD settings:

- not speaking: a frame is voiced when ``p >= threshold``; a run of voiced frames (frames
  with ``threshold - 0.15 <= p < threshold`` neither extend nor break it) reaching
  ``min_speech_ms`` fires ``speech_started`` with the run's first frame start as onset;
- speaking: a frame with ``p >= threshold - 0.15`` still counts as speech; once
  ``silence_duration_ms`` of audio has passed since the end of the last such frame,
  ``speech_stopped`` fires with that end as the offset.

Event positions are in ms of this detector's input, so frame granularity is 32 ms.

Weights: silero-vad's ``silero_vad.onnx`` (v6.2.3, MIT), kept in ``realtime/silero/`` and run
by onnxruntime, so the API tier needs neither torch nor the ``silero-vad`` package (whose
wheel requires torch). onnxruntime costs 0.11 ms per 32 ms frame on this project's 2-core
box, against 0.36 ms for silero's TorchScript release of the same network (same
probabilities within 2e-6; tests/unit/test_vad.py compares the two). The network is loaded
once per process (:func:`load_model`) and shared by every detector: it is called as a pure
function with the recurrent state and the 64-sample context that each detector keeps for
itself, so detectors never share state; calls on one detector are serialized by its own
lock. A detector can be handed another :class:`Net` (the test hands it the TorchScript one).
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from math import gcd
from pathlib import Path
from typing import Literal

import numpy as np

VAD_RATE = 16000
FRAME = 512  # samples at 16 kHz per silero call (32 ms)
CONTEXT = 64  # samples of the previous frame silero prepends
FRAME_MS = FRAME * 1000 // VAD_RATE
NEG_MARGIN = 0.15  # silero's VADIterator: speech ends below threshold - 0.15

WEIGHTS = Path(__file__).with_name("silero") / "silero_vad.onnx"

_model_lock = threading.Lock()
_model: Net | None = None


class Net(abc.ABC):
    """silero's 16 kHz network as a pure function: ``(x [1, CONTEXT + FRAME], state
    [2, 1, 128]) -> (p, state)``; the caller keeps the state, so one instance serves
    every detector (concurrent calls on one loaded model are allowed)."""

    @abc.abstractmethod
    def __call__(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """Speech probability of the frame, and the next recurrent state."""

    def batch(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Frames of several streams at once: ``(x [B, CONTEXT + FRAME], state
        [2, B, 128]) -> (p [B], state [2, B, 128])``, row ``i`` as ``self(x[i:i+1],
        state[:, i:i+1])`` would give it (here: one call per row)."""
        probs, states = [], []
        for i in range(len(x)):
            p, s = self(x[i : i + 1], state[:, i : i + 1])
            probs.append(p)
            states.append(s)
        return np.array(probs, np.float32), np.concatenate(states, axis=1)


class _OnnxNet(Net):
    def __init__(self, path: Path = WEIGHTS) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(VAD_RATE, dtype=np.int64)

    def __call__(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        p, state = self._session.run(None, {"input": x, "state": state, "sr": self._sr})
        return float(p[0, 0]), state

    def batch(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # The network takes a batch as it is, rows bit-identical to one-row calls
        # (tests/unit/test_vad_batch.py); on the 2-core box one row cost 154 µs alone and
        # 80 µs in a batch of 8 (docs/PERFORMANCE.md).
        p, state = self._session.run(None, {"input": x, "state": state, "sr": self._sr})
        return p[:, 0], state


def load_model() -> Net:
    """silero-vad's network on onnxruntime, loaded and warmed up once per process, then
    shared by every detector."""
    global _model
    with _model_lock:
        if _model is None:
            _model = warm(_OnnxNet())
        return _model


def warm(net: Net) -> Net:
    """``net`` after a few calls on silence (first calls are the slow ones)."""
    state = np.zeros((2, 1, 128), np.float32)
    for _ in range(3):
        _, state = net(np.zeros((1, CONTEXT + FRAME), np.float32), state)
    return net


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["speech_started", "speech_stopped"]
    # ms since this detector's first fed sample: where speech began (first voiced sample)
    # or ended (last voiced sample).
    audio_ms: int


class _Resampler:
    """Streaming polyphase resampler ``rate → 16 kHz`` (up U, down D), Kaiser-windowed sinc.

    The filter is centred (zero delay): output ``m`` uses input up to time ``m·D/U + half``,
    so the last ``half`` input samples wait for more input before their outputs appear.
    """

    HALF = 16  # input samples each side of an output sample

    def __init__(self, rate: int) -> None:
        g = gcd(rate, VAD_RATE)
        self.up, self.down = VAD_RATE // g, rate // g
        self.identity = self.up == self.down
        self._buf = np.zeros(0, np.float32)
        self._start = 0  # absolute input index of _buf[0]
        self._fed = 0  # input samples so far
        self._made = 0  # output samples so far
        if self.identity:
            return
        u = self.up
        n_taps = 2 * self.HALF * u + 1
        self._centre = self.HALF * u
        cutoff = 0.45 * min(rate, VAD_RATE) / (rate * u)  # cycles per upsampled sample
        n = np.arange(n_taps) - self._centre
        h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(n_taps, 8.0) * u
        width = -(-n_taps // u)
        phases = np.zeros((u, width), np.float32)
        for p in range(u):
            taps = h[p::u]
            phases[p, : len(taps)] = taps
        self._phases = phases  # phase p: taps h[p + u·j], j = 0..width-1
        self._taps_reversed = np.ascontiguousarray(phases[:, ::-1])
        self._width = width
        # Zeros stand for the input before the first sample.
        self._buf = np.zeros(width, np.float32)
        self._start = -width

    def push(self, x: np.ndarray) -> np.ndarray:
        self._fed += len(x)
        if self.identity:
            self._made += len(x)
            return x
        self._buf = np.concatenate([self._buf, x])
        u, d = self.up, self.down
        # Output m needs input index (m·d + centre) // u <= fed - 1.
        last = ((self._fed - 1) * u - self._centre) // d if self._fed else -1
        count = last + 1 - self._made
        if count <= 0:
            return np.zeros(0, np.float32)
        out = self._filter_range(self._made, count)
        self._made += count
        newest = ((self._made - 1) * self.down + self._centre) // self.up
        keep_from = newest + 1 - self._width - self._start
        if keep_from > 0:
            self._buf = self._buf[keep_from:]
            self._start += keep_from
        return out

    def _filter_range(self, m0: int, n: int) -> np.ndarray:
        """Outputs ``m0 … m0+n-1``. Outputs ``up`` apart share a filter phase and their
        input windows lie ``down`` samples apart, so each of the ``up`` interleaved series
        is one strided view times one tap vector (no index arithmetic per sample)."""
        out = np.empty(n, np.float32)
        windows = np.lib.stride_tricks.sliding_window_view(self._buf, self._width)
        for r in range(min(self.up, n)):
            n0 = (m0 + r) * self.down + self._centre
            phase, base = n0 % self.up, n0 // self.up  # base: newest input index used
            first = base - self._width + 1 - self._start
            rows = windows[first :: self.down][: len(range(r, n, self.up))]
            out[r :: self.up] = rows @ self._taps_reversed[phase]
        return out


class SileroVAD:
    """Streaming server VAD for one input stream (thread-safe per instance)."""

    def __init__(
        self,
        *,
        threshold: float = 0.5,
        silence_duration_ms: int = 500,
        sample_rate: int = 24000,
        min_speech_ms: int = 64,
        net: Net | None = None,
    ) -> None:
        self._net = net or load_model()
        self.lock = threading.Lock()
        self.sample_rate = sample_rate
        self.min_speech_ms = min_speech_ms
        self.threshold = threshold
        self.silence_duration_ms = silence_duration_ms
        self._resampler = _Resampler(sample_rate)
        self._odd = b""  # a trailing half sample
        self._pending = np.zeros(0, np.float32)  # 16 kHz samples not yet in a frame
        self._context = np.zeros((1, CONTEXT), np.float32)
        self._state = np.zeros((2, 1, 128), np.float32)
        self._frames = 0  # frames scored so far
        self._fed = 0  # input samples so far
        self._speaking = False
        self._run_start: int | None = None  # onset frame of a candidate run (not speaking)
        self._last_speech_end = 0  # speaking: end (frame index) of the last speech frame

    def configure(self, *, threshold: float, silence_duration_ms: int) -> None:
        with self.lock:
            self.threshold = threshold
            self.silence_duration_ms = silence_duration_ms

    @property
    def position_ms(self) -> int:
        return self._fed * 1000 // self.sample_rate

    @property
    def speaking(self) -> bool:
        return self._speaking

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        with self.lock:
            frames = self.frames(pcm16)
            probs = []
            for frame in frames:
                x = self.net_input(frame)
                p, state = self._net(x, self._state)
                self.scored(x, state)
                probs.append(p)
            return self.decide(probs)

    # The steps of ``feed``, for a caller that scores the frames of many detectors in one
    # batch (``api/realtime/vad_batch.py``): frames → (net_input → the net → scored) per
    # frame, in order → decide.

    def frames(self, pcm16: bytes) -> np.ndarray:
        """The 16 kHz frames ``pcm16`` completes, ``[n, FRAME]`` (n may be 0)."""
        data = self._odd + pcm16
        whole = len(data) - len(data) % 2
        self._odd = data[whole:]
        if not whole:
            return np.zeros((0, FRAME), np.float32)
        x = np.frombuffer(data[:whole], "<i2").astype(np.float32) / 32768.0
        self._fed += len(x)
        self._pending = np.concatenate([self._pending, self._resampler.push(x)])
        n = len(self._pending) // FRAME
        frames = self._pending[: n * FRAME].reshape(n, FRAME)
        self._pending = self._pending[n * FRAME :]
        return frames

    def net_input(self, frame: np.ndarray) -> np.ndarray:
        """The network's input for the next frame: ``[1, CONTEXT + FRAME]``."""
        return np.concatenate([self._context, frame[None, :]], axis=1)

    @property
    def state(self) -> np.ndarray:
        """The recurrent state the next frame is scored with, ``[2, 1, 128]``."""
        return self._state

    def scored(self, x: np.ndarray, state: np.ndarray) -> None:
        """The network scored ``x`` (from :meth:`net_input`) and returned ``state``."""
        self._state = np.ascontiguousarray(state)
        self._context = x[:, -CONTEXT:]

    def decide(self, probs: list[float]) -> list[VadEvent]:
        """The events of the frames scored ``probs``, in order."""
        events: list[VadEvent] = []
        for p in probs:
            event = self._decide(float(p))
            if event is not None:
                events.append(event)
        return events

    def _decide(self, p: float) -> VadEvent | None:
        i = self._frames  # this frame covers [i, i + 1) in frame units
        self._frames += 1
        neg = max(self.threshold - NEG_MARGIN, 0.01)
        if not self._speaking:
            if p >= self.threshold:
                if self._run_start is None:
                    self._run_start = i
                if (i + 1 - self._run_start) * FRAME_MS >= self.min_speech_ms:
                    self._speaking = True
                    self._last_speech_end = i + 1
                    return VadEvent("speech_started", self._ms(self._run_start))
            elif p < neg:
                self._run_start = None
            return None
        if p >= neg:
            self._last_speech_end = i + 1
        elif (i + 1 - self._last_speech_end) * FRAME_MS >= self.silence_duration_ms:
            self._speaking = False
            self._run_start = None
            return VadEvent("speech_stopped", self._ms(self._last_speech_end))
        return None

    def _ms(self, frame: int) -> int:
        """Start of 16 kHz frame ``frame`` in ms of input (the resampler has no delay)."""
        return frame * FRAME_MS
