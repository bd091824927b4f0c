"""What tells speech from a tune, measured on float samples: the syllabic rhythm of the
loudness and the median pitch. Shared by the unit and integration tests of
``reference/speech``."""

from __future__ import annotations

import numpy as np


def syllabic_peak_hz(x: np.ndarray, rate: int) -> tuple[float, float]:
    """The strongest frequency (0.5-25 Hz) of the RMS envelope (10 ms frames) and the
    share of the envelope's power between 2 and 8 Hz, where syllables are."""
    hop = rate // 100
    frames = x[: len(x) // hop * hop].reshape(-1, hop)
    env = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    env = env - env.mean()
    power = np.abs(np.fft.rfft(env * np.hanning(len(env)))) ** 2
    hz = np.fft.rfftfreq(len(env), d=0.01)
    inside = (hz > 0.5) & (hz <= 25)
    band = power[(hz >= 2) & (hz <= 8)].sum()
    peak = float(hz[inside][np.argmax(power[inside])])
    return peak, float(band / power[inside].sum())


def median_f0(x: np.ndarray, rate: int) -> float:
    """Median F0 (Hz, 60-400) of the voiced 40 ms frames, by autocorrelation."""
    size, lo, hi = int(0.04 * rate), rate // 400, rate // 60
    f0s = []
    for start in range(0, len(x) - size, size // 2):
        frame = x[start : start + size].astype(np.float64)
        frame = frame - frame.mean()
        if np.sqrt(np.mean(frame**2)) < 0.02:
            continue
        ac = np.correlate(frame, frame, "full")[size - 1 :]
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.4 * ac[0]:  # voiced: a strong periodic peak
            f0s.append(rate / lag)
    if len(f0s) < 10:
        raise AssertionError(f"only {len(f0s)} voiced frames")
    return float(np.median(f0s))
