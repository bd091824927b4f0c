"""Speech from the eSpeak NG synthesizer: real, intelligible (if robotic) speech without
weights, for ``reference/speech`` and for ``reference/voice`` with ``speech = "espeak-ng"``.

Two engines, the first one found wins:

* **the library** of the ``espeakng-loader`` package (the ``speech`` extra: a wheel that
  bundles ``libespeak-ng.so`` and ``espeak-ng-data``), called through ``ctypes`` in
  synchronous mode with a synth callback, in a helper process that forks a child per
  call (:class:`_Library` says why). libespeak-ng is a process-wide singleton and not
  thread-safe, and the helper answers one request at a time: every call holds
  :data:`_LOCK`.
* **the binary** ``espeak-ng`` on PATH (``--stdout`` writes a WAV).

eSpeak NG is GPL-3.0-or-later. It is an optional dependency run in a separate process (the
helper that loads the bundled library, or the binary); omniqueue links nothing against it.

Both speak at 22.05 kHz mono. Rate follows ``speed`` (175 words/min at 1.0); pitch is
espeak's 0–99 (50: the variant's normal).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import threading
import wave
from collections.abc import Callable
from dataclasses import dataclass
from importlib import util
from pathlib import Path
from typing import Any

import av
import numpy as np

ESPEAK_RATE = 22_050
FEMALE = frozenset({"coral", "sage", "shimmer", "marin"})
TIMEOUT_S = 10.0
_LOCK = threading.Lock()
# Gets each block of int16 samples as espeak makes it; True stops the synthesis.
_Sink = Callable[[np.ndarray], bool]


@dataclass(frozen=True)
class Voice:
    """An espeak voice: a language, a variant (``voices/!v``), a pitch and a pitch range."""

    variant: str
    pitch: int = 50
    pitch_range: int = 50
    language: str = "en-us"

    @property
    def name(self) -> str:
        return f"{self.language}+{self.variant}"


def words_per_minute(speed: float) -> int:
    """espeak's rate (80–450 words/min) for an OpenAI ``speed`` (175 at 1.0)."""
    return int(min(450, max(80, round(175 * speed))))


def espeak_pitch(user_f0_hz: float | None, base_hz: float) -> int:
    """espeak's pitch (0–99, 50 = the variant's normal) from the user's median F0: one
    octave above the voice's base pitch is +40."""
    if not user_f0_hz:
        return 50
    return int(min(99, max(0, round(50 + 40 * math.log2(user_f0_hz / base_hz)))))


# ---- engines ----------------------------------------------------------------------------


class _Library:
    """libespeak-ng from the espeakng-loader wheel, in a helper process
    (``espeak_server.py``) that initialises it once and forks a child per call.

    The library keeps synthesis state in C statics that nothing resets (the pitch
    flutter's phase, ``espeak_Terminate`` leaves it), so in one process the same text
    spoken twice differs; a fresh library per call leaked a few KB each. Each child
    speaks from the state the helper had after initialising, with a fixed seed for the
    noise (initialisation seeds it with the time), and then exits: the same text, voice
    and rate give the same samples whatever was spoken before, and nothing accumulates.
    The helper also keeps the GPL library out of the worker process. A call costs a fork
    (about 1 ms) on top of the synthesis; the helper starts with :func:`start` or on first
    use (about 50 ms) and ends when its stdin closes (this process exited).
    """

    def __init__(self) -> None:
        import espeakng_loader

        self.argv = [
            sys.executable,
            "-I",
            str(Path(__file__).with_name("espeak_server.py")),
            espeakng_loader.get_library_path(),
            espeakng_loader.get_data_path(),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = os.getpid()

    def start(self) -> None:
        self._helper()

    def _helper(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None or self.pid != os.getpid():
            self.pid = os.getpid()  # a forked copy of this process starts its own
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
            )
        return self.proc

    def speak(self, text: str, voice: Voice, wpm: int, sink: _Sink) -> None:
        """Synthesise ``text``; ``sink`` gets the samples. The caller holds
        :data:`_LOCK`. A helper that died is started again once."""
        req = {"text": text, "voice": voice.name, "rate": wpm, "pitch": voice.pitch,
               "range": voice.pitch_range}  # fmt: skip
        line = json.dumps(req).encode() + b"\n"
        for attempt in (1, 2):
            proc = self._helper()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(line)
                status, length = struct.unpack("<ii", _read(proc.stdout, 8))
                body = _read(proc.stdout, length)
                break
            except (OSError, EOFError, struct.error):
                proc.kill()
                proc.wait()
                if attempt == 2:
                    raise RuntimeError("the eSpeak NG helper process died") from None
        if status != 0:
            raise RuntimeError(f"eSpeak NG: {body.decode(errors='replace')}")
        sink(np.frombuffer(body, "<i2").copy())


def _read(stream: Any, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = stream.read(n - len(out))
        if not chunk:
            raise EOFError("the eSpeak NG helper closed its output")
        out += chunk
    return out


_library: _Library | None = None


def _get_library() -> _Library | None:
    global _library
    if _library is None and has_library():
        _library = _Library()
    return _library


def start() -> None:
    """Start the library's helper process now (a worker's ``load``), so the first request
    does not wait for it; nothing without the library."""
    with _LOCK:
        lib = _get_library()
        if lib is not None:
            lib.start()


def has_library() -> bool:
    return util.find_spec("espeakng_loader") is not None


def has_binary() -> bool:
    return shutil.which("espeak-ng") is not None


def available() -> bool:
    """Whether either engine is installed."""
    return has_library() or has_binary()


def _binary(text: str, voice: Voice, wpm: int) -> np.ndarray:
    cmd = ["espeak-ng", "--stdout", "-v", voice.name, "-s", str(wpm), "-p", str(voice.pitch)]
    cmd.append(text)
    wav = subprocess.run(cmd, capture_output=True, check=True, timeout=TIMEOUT_S).stdout
    with wave.open(io.BytesIO(wav)) as w:
        if w.getframerate() != ESPEAK_RATE:
            raise RuntimeError(f"espeak-ng wrote {w.getframerate()} Hz, not {ESPEAK_RATE}")
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").copy()


def _collect(parts: list[np.ndarray]) -> _Sink:
    def sink(samples: np.ndarray) -> bool:
        parts.append(samples)
        return False

    return sink


def speak(text: str, voice: Voice, wpm: int, *, block: int = 2205) -> list[np.ndarray]:
    """``text`` spoken, as int16 blocks at 22.05 kHz: the library's callback blocks (its
    own buffering), or the binary's output cut into ``block`` samples."""
    parts: list[np.ndarray] = []
    with _LOCK:  # the library is one per process, and so is its loader
        lib = _get_library()
        if lib is not None:
            lib.speak(text, voice, wpm, _collect(parts))
            return parts
    if not has_binary():
        raise RuntimeError(
            "eSpeak NG is not installed: pip install 'omniqueue[speech]' (espeakng-loader) "
            "or put espeak-ng on PATH"
        )
    whole = _binary(text, voice, wpm)
    return [whole[i : i + block] for i in range(0, len(whole), block)]


def speak_all(text: str, voice: Voice, wpm: int) -> np.ndarray:
    """``text`` spoken, as one int16 array at 22.05 kHz."""
    parts = speak(text, voice, wpm)
    return np.concatenate(parts) if parts else np.zeros(0, np.int16)


def synthesize(text: str, voice: str, speed: float, pitch: int, rate: int) -> np.ndarray:
    """``text`` spoken with a male or female variant by the OpenAI ``voice`` name, as
    int16 mono samples at ``rate`` (``reference/voice``)."""
    variant = "f3" if voice in FEMALE else "m3"
    samples = speak_all(text, Voice(variant, pitch=pitch), words_per_minute(speed))
    if rate == ESPEAK_RATE:
        return samples
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
    frame.sample_rate = ESPEAK_RATE
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    chunks = [f.to_ndarray()[0] for f in [*resampler.resample(frame), *resampler.resample(None)]]
    return np.concatenate(chunks).astype(np.int16) if chunks else np.zeros(0, np.int16)
