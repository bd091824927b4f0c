"""Speech from the eSpeak NG synthesizer (``espeak-ng`` on PATH), for ``reference/voice``
with ``speech = "espeak-ng"``: real, intelligible (if robotic) speech without weights.

``espeak-ng --stdout`` writes a 22.05 kHz mono WAV; it is resampled to the session rate
with PyAV. Rate follows ``speed`` (175 words/min at 1.0), pitch (espeak's 0–99) follows the
user's median F0 relative to the voice's base pitch, and the OpenAI voice picks a male or
female espeak variant.
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import wave

import av
import numpy as np

FEMALE = frozenset({"coral", "sage", "shimmer", "marin"})
TIMEOUT_S = 10.0


def available() -> bool:
    return shutil.which("espeak-ng") is not None


def espeak_pitch(user_f0_hz: float | None, base_hz: float) -> int:
    """espeak's pitch (0–99, 50 = the variant's normal) from the user's median F0: one
    octave above the voice's base pitch is +40."""
    if not user_f0_hz:
        return 50
    return int(min(99, max(0, round(50 + 40 * math.log2(user_f0_hz / base_hz)))))


def synthesize(text: str, voice: str, speed: float, pitch: int, rate: int) -> np.ndarray:
    """``text`` spoken, as int16 mono samples at ``rate``."""
    variant = "en-us+f3" if voice in FEMALE else "en-us+m3"
    words_per_min = str(int(min(450, max(80, 175 * speed))))
    cmd = ["espeak-ng", "--stdout", "-v", variant, "-s", words_per_min, "-p", str(pitch), text]
    wav = subprocess.run(cmd, capture_output=True, check=True, timeout=TIMEOUT_S).stdout
    with wave.open(io.BytesIO(wav)) as w:
        source_rate = w.getframerate()
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    if source_rate == rate:
        return samples.copy()
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
    frame.sample_rate = source_rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    chunks = [f.to_ndarray()[0] for f in [*resampler.resample(frame), *resampler.resample(None)]]
    return np.concatenate(chunks).astype(np.int16) if chunks else np.zeros(0, np.int16)
