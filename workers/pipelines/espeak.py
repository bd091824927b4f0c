"""Speech from the eSpeak NG synthesizer: real, intelligible (if robotic) speech without
weights, for ``reference/speech`` and for ``reference/voice`` with ``speech = "espeak-ng"``.

Two engines, the first one found wins:

* **the library** of the ``espeakng-loader`` package (the ``speech`` extra: a wheel that
  bundles ``libespeak-ng.so`` and ``espeak-ng-data``), called through ``ctypes`` in
  synchronous mode with a synth callback that gets the samples as they are made, loaded
  afresh for each call (:class:`_Library` says why). libespeak-ng is a process-wide
  singleton and not thread-safe: every call holds :data:`_LOCK`.
* **the binary** ``espeak-ng`` on PATH (``--stdout`` writes a WAV).

eSpeak NG is GPL-3.0-or-later. It is an optional dependency loaded at run time (dlopen of
the bundled library, or a separate process); omniqueue links nothing against it.

Both speak at 22.05 kHz mono. Rate follows ``speed`` (175 words/min at 1.0); pitch is
espeak's 0–99 (50: the variant's normal).
"""

from __future__ import annotations

import _ctypes
import atexit
import ctypes
import io
import math
import os
import shutil
import subprocess
import tempfile
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
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_RATE, _PITCH, _RANGE = 1, 3, 4
_LOCK = threading.Lock()
# Gets each block of int16 samples as espeak makes it; True stops the synthesis.
_Sink = Callable[[np.ndarray], bool]
_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


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
    """libespeak-ng from the espeakng-loader wheel, loaded afresh for every synthesis.

    The library keeps synthesis state in C statics that nothing resets (the pitch
    flutter's phase and the like; ``espeak_Terminate`` leaves them), so the same text
    spoken twice in one process differs by a few samples. Each :meth:`speak` therefore
    ``dlopen``s a private copy of the library (a copy: another user of the wheel's file
    would keep it loaded), initialises it, speaks, terminates it and ``dlclose``s it:
    the same text, voice and rate give the same samples, whatever was spoken before. It
    costs about 3 ms per call.
    """

    def __init__(self) -> None:
        import espeakng_loader

        self.tmp = Path(tempfile.mkdtemp(prefix="omniq-espeak-"))
        self.path = str(self.tmp / "libespeak-ng.so")
        shutil.copyfile(espeakng_loader.get_library_path(), self.path)
        atexit.register(_remove, self.tmp, os.getpid())
        self.data = espeakng_loader.get_data_path().encode()

    def speak(self, text: str, voice: Voice, wpm: int, sink: _Sink) -> None:
        """Synthesise ``text``; ``sink`` gets each block of samples as it is made and
        returns True to stop. The caller holds :data:`_LOCK`."""
        lib = ctypes.CDLL(self.path, mode=os.RTLD_LOCAL)
        try:
            _declare(lib)
            rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, self.data, 0)
            if rate != ESPEAK_RATE:
                raise RuntimeError(f"libespeak-ng did not initialise (it answered {rate})")

            def on_samples(wav: Any, count: int, _events: Any) -> int:
                if not wav or count <= 0:
                    return 0
                return 1 if sink(np.ctypeslib.as_array(wav, shape=(count,)).copy()) else 0

            callback = _CALLBACK(on_samples)  # alive until espeak_Synth returns
            lib.espeak_SetSynthCallback(callback)
            if lib.espeak_SetVoiceByName(voice.name.encode()) != 0:
                raise ValueError(f"espeak has no voice {voice.name!r}")
            lib.espeak_SetParameter(_RATE, wpm, 0)
            lib.espeak_SetParameter(_PITCH, voice.pitch, 0)
            lib.espeak_SetParameter(_RANGE, voice.pitch_range, 0)
            raw = text.encode() + b"\0"
            err = lib.espeak_Synth(raw, len(raw), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            if err not in (0, 1):  # EE_OK, or EE_INTERNAL_ERROR after the sink stopped it
                raise RuntimeError(f"espeak_Synth failed with {err}")
        finally:
            lib.espeak_Terminate()
            _ctypes.dlclose(lib._handle)


def _remove(tmp: Path, pid: int) -> None:
    if os.getpid() == pid:  # not from a forked child: the parent still uses it
        shutil.rmtree(tmp, ignore_errors=True)


def _declare(lib: ctypes.CDLL) -> None:
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_Synth.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip


_library: _Library | None = None


def _get_library() -> _Library | None:
    global _library
    if _library is None and has_library():
        _library = _Library()
    return _library


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
