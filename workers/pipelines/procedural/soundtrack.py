"""The soundtrack of a scene: pad chords, bass and an arpeggio panned with the main shape."""

from __future__ import annotations

import numpy as np
import torch

from workers.pipelines.procedural.render import shape_path
from workers.pipelines.procedural.scene import Scene

SAMPLE_RATE = 48_000  # of soundtrack()
_MAJOR = ((0, (0, 4, 7)), (7, (0, 4, 7)), (9, (0, 3, 7)), (5, (0, 4, 7)))  # I V vi IV
_MINOR = ((0, (0, 3, 7)), (8, (0, 4, 7)), (3, (0, 4, 7)), (10, (0, 4, 7)))  # i VI III VII


def soundtrack(sc: Scene, n: int) -> np.ndarray:
    """Pad chords, bass and a panned arpeggio: float32 (2, n) in [-1, 1]."""
    t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
    bar = 2.0 / min(max(sc.motion, 0.5), 2.0)  # one chord per bar
    prog = _MINOR if sc.minor else _MAJOR
    chord = (t // bar).astype(np.int64) % 4
    tc = t % bar
    degree = np.array([d for d, _ in prog])[chord]
    triad = np.array([tri for _, tri in prog])[chord]  # n x 3 semitones

    def phase(midi: np.ndarray, detune: float = 0.0) -> np.ndarray:
        freq = 440.0 * 2 ** ((midi - 69) / 12) * (1 + detune)
        return 2 * np.pi * np.cumsum(freq) / SAMPLE_RATE  # continuous across note changes

    pad = np.zeros((2, n))
    for v in range(3):
        for side, detune in ((0, -0.0015), (1, 0.0015)):  # slight detune: stereo width
            ph = phase(sc.root_midi + 12 + degree + triad[:, v], detune)
            pad[side] += 0.1 * (np.sin(ph) + 0.25 * np.sin(2 * ph))
    pad *= np.clip(tc / 0.4, 0, 1) * np.clip((bar - tc) / 0.4, 0, 1)
    ph = phase(sc.root_midi + degree)
    bass = 0.25 * (np.sin(ph) + 0.3 * np.sin(2 * ph)) * np.exp(-1.5 * tc) * np.clip(tc / 0.01, 0, 1)
    bass *= np.clip((bar - tc) / 0.05, 0, 1)

    beat = bar / 4
    tb = t % beat
    order = np.array([0, 1, 2, 3, 2, 1, 0, 3])[(t // beat).astype(np.int64) % 8]
    tones = np.concatenate([triad, np.full((n, 1), 12)], axis=1)[np.arange(n), order]
    ph = phase(sc.root_midi + 24 + degree + tones)
    arp = 0.2 * (np.sin(ph) + 0.15 * np.sin(3 * ph))
    arp *= (1 - np.exp(-tb / 0.004)) * np.exp(-6 * tb) * np.clip((beat - tb) / 0.01, 0, 1)

    # Equal-power pan following the main shape's x on screen (zoom keeps its side).
    control = np.arange(0.0, n / SAMPLE_RATE + 0.02, 0.01)  # 100 Hz control rate
    x, _, _ = shape_path(sc.shapes[-1], torch.from_numpy(control * sc.motion).float())
    pan = np.interp(t, control, (x / sc.aspect).clamp(0, 1).double().numpy()) * np.pi / 2
    mix = pad + bass + np.sqrt(2) * arp * np.stack([np.cos(pan), np.sin(pan)])
    peak = float(np.abs(mix).max()) if n else 0.0
    edges = np.clip(np.minimum(t, t[::-1]) / 0.01, 0, 1)  # 10 ms fades, no clicks
    return (mix * edges * (0.7 / peak if peak > 0 else 1.0)).astype(np.float32)
