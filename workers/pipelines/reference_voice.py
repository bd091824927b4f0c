"""``reference/voice``: a weight-free voice responder for realtime audio sessions.

CPU, nothing to download, deterministic (the same turn, voice and speed give the same
bytes). It does not understand speech; it answers each user turn with speech-like audio
derived from that turn, so the protocol, VAD, barge-in and latency can be exercised
anywhere. What it does (see ``docs/reference-voice.md``):

* **Length.** ``min(6 s, (0.6 s + 0.5 x turn) / speed)`` rounded up to whole 40 ms steps,
  where ``turn`` is the user audio's duration, or for a text-only turn its length at 15
  characters per second.
* **Transcript.** A fixed acknowledgement: ``"I heard you speak for 1.4 seconds."`` (audio),
  ``"You wrote 5 words."`` (text only), ``"I am listening."`` (neither). Each word is sent
  with the step in which its first syllable starts, so transcript deltas follow the audio.
* **Pitch.** The F0 track of the user's audio is estimated by autocorrelation (40 ms
  frames, 20 ms hop, 70-400 Hz, the shortest lag within 10 % of the best normalized peak
  against octave errors, voiced when that peak exceeds 0.45 and the frame is above
  -45 dBFS); its shape relative to its median, median-smoothed and clamped to
  half/double, is stretched over the answer and applied to the voice's base pitch.
  Fewer than 3 voiced frames (or a text turn): the base pitch with a gentle declination
  (+8 % → -8 %).
* **Sound.** A source-filter model computed in the frequency domain: the harmonics of a
  glottal pulse train (amplitude 1/k) at the planned F0, weighted by the magnitude response
  of three vowel formant resonators (F1-F3 of a/e/i/o/u, picked from the vowels of each
  syllable of the transcript, gliding from the previous syllable's), under a raised-cosine
  syllable envelope, with a short noise burst at each syllable onset and a pause between
  words. ``instructions`` are accepted and ignored.
* **espeak-ng** (``speech="espeak-ng"``, from the registry's ``adapter_options``): the same
  transcript spoken by eSpeak NG instead (:mod:`workers.pipelines.espeak`), its pitch set
  from the user's median F0; the answer is as long as espeak speaks it.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

import numpy as np

from models.catalog import REFERENCE_VOICE
from workers.pipelines import espeak
from workers.pipelines.base import NoWeights, VoiceChunk, VoicePipeline, VoiceTurn

MIN_REPLY_S = 0.6
PER_TURN_S = 0.5
MAX_REPLY_S = 6.0
TEXT_CHARS_PER_S = 15.0
TAIL_S = 0.08  # silence closing every answer
WORD_GAP = 0.3  # pause between words, in syllables
F0_MIN, F0_MAX = 70.0, 400.0
VOICED_PEAK = 0.45
MAX_HARMONIC_HZ = 5000.0
LEVEL = 0.22  # RMS of a sustained vowel (full scale 1.0)
CONTROL = 8  # samples between evaluations of the spectral envelope

BASE_PITCH_HZ = {
    "alloy": 150.0,
    "ash": 110.0,
    "ballad": 125.0,
    "coral": 210.0,
    "echo": 105.0,
    "sage": 190.0,
    "shimmer": 220.0,
    "verse": 130.0,
    "marin": 200.0,
    "cedar": 100.0,
}
DEFAULT_PITCH_HZ = 150.0
# Formants (Hz) of the five vowels (Peterson & Barney averages) and their bandwidths.
VOWELS = {
    "a": (730.0, 1090.0, 2440.0),
    "e": (530.0, 1840.0, 2480.0),
    "i": (270.0, 2290.0, 3010.0),
    "o": (570.0, 840.0, 2410.0),
    "u": (300.0, 870.0, 2240.0),
}
BANDWIDTHS = np.array([80.0, 100.0, 120.0])
_VOWEL_GROUP = re.compile(r"[aeiouy]+")


@dataclass
class SpokenState:
    """An answer spoken by espeak-ng, precomputed and handed out step by step."""

    words: list[str]
    transcript: str
    pcm: bytes  # whole steps (the last one padded with silence)
    word_start: np.ndarray  # per word, in samples
    turn_s: float
    pos: int = 0
    next_word: int = 0


@dataclass
class VoiceState:
    words: list[str]
    transcript: str
    total: int  # samples of the answer
    f0_times: np.ndarray  # sample positions of the planned F0 points
    f0_hz: np.ndarray
    syl_start: np.ndarray  # per syllable, in samples
    syl_end: np.ndarray
    syl_formants: np.ndarray  # (syllables, 3)
    prev_formants: np.ndarray  # (syllables, 3): the formants each syllable glides from
    word_start: np.ndarray  # per word, in samples
    rng: np.random.Generator
    pos: int = 0
    phase: float = 0.0
    next_word: int = 0
    duration_s: float = 0.0
    turn_s: float = 0.0
    user_f0: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _pcm_to_float(pcm16: bytes) -> np.ndarray:
    pcm16 = pcm16[: len(pcm16) - len(pcm16) % 2]
    return np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0


F0_RATE = 8000


def estimate_f0(pcm16: bytes, rate: int) -> np.ndarray:
    """F0 in Hz every 20 ms (0 where unvoiced), by normalized autocorrelation."""
    x = _pcm_to_float(pcm16)
    if rate % F0_RATE == 0 and rate > F0_RATE:
        # F0 stays below 400 Hz: a boxcar-decimated 8 kHz signal is enough, at a ninth of
        # the FFT work (this runs before a response's first audio)
        k = rate // F0_RATE
        x = x[: len(x) // k * k].reshape(-1, k).mean(axis=1)
        rate = F0_RATE
    n, hop = rate * 40 // 1000, rate * 20 // 1000
    if len(x) < n:
        return np.zeros(0)
    count = 1 + (len(x) - n) // hop
    frames = np.lib.stride_tricks.sliding_window_view(x, n)[::hop][:count].astype(np.float64)
    frames = frames - frames.mean(axis=1, keepdims=True)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    window = np.hanning(n)
    size = 1 << (2 * n - 1).bit_length()
    spec = np.fft.rfft(frames * window, size, axis=1)
    acf = np.fft.irfft(np.abs(spec) ** 2, size, axis=1)[:, :n]
    wacf = np.fft.irfft(np.abs(np.fft.rfft(window, size)) ** 2, size)[:n]
    lo, hi = int(rate / F0_MAX), int(rate / F0_MIN)
    norm = acf[:, lo : hi + 1] / np.maximum(acf[:, :1], 1e-12) / (wacf[lo : hi + 1] / wacf[0])
    # The shortest lag within 10 % of the best peak (its multiples score as high: octave
    # errors), then the top of that peak.
    rows = np.arange(count)
    top = norm.max(axis=1, keepdims=True)
    first = np.argmax(norm >= 0.9 * top, axis=1)
    near = np.lib.stride_tricks.sliding_window_view(np.pad(norm, ((0, 0), (0, 12))), 12, axis=1)
    best = first + np.argmax(near[rows, first], axis=1)
    peak = norm[rows, best]
    f0 = rate / (lo + best)
    voiced = (peak > VOICED_PEAK) & (rms > 10 ** (-45 / 20))
    return np.where(voiced, f0, 0.0)


def _median_smooth(x: np.ndarray, width: int = 5) -> np.ndarray:
    if len(x) < width:
        return x
    pad = width // 2
    padded = np.pad(x, pad, mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, width), axis=1)


def _syllables(word: str) -> list[str]:
    """One vowel letter per syllable (vowel groups; y reads as i; none: one 'a')."""
    groups = _VOWEL_GROUP.findall(word.lower())
    return [("i" if g[0] == "y" else g[0]) for g in groups] or ["a"]


class ReferenceVoicePipeline(NoWeights, VoicePipeline[VoiceState | SpokenState]):
    spec = REFERENCE_VOICE
    sample_rate = 24000
    step_ms = 40

    def __init__(self, speech: str = "synth") -> None:
        """``speech``: ``"synth"`` (the source-filter model, the default) or ``"espeak-ng"``
        (the transcript spoken by eSpeak NG; registry ``adapter_options``)."""
        if speech not in ("synth", "espeak-ng"):
            raise ValueError(f"speech must be 'synth' or 'espeak-ng', got {speech!r}")
        self.speech = speech

    def load(self, device: str) -> None:
        """Nothing to load: numpy on the CPU whatever the worker's device (espeak-ng must
        be on PATH when it is asked for)."""
        if self.speech == "espeak-ng" and not espeak.available():
            raise RuntimeError(
                "reference/voice speech='espeak-ng' needs eSpeak NG: pip install "
                "'omniqueue[speech]' or put espeak-ng on PATH"
            )
        if self.speech == "espeak-ng":
            espeak.start()

    @property
    def step_samples(self) -> int:
        return self.sample_rate * self.step_ms // 1000

    def start_response(self, turn: VoiceTurn) -> VoiceState | SpokenState:
        rate = self.sample_rate
        audio_s = (len(turn.pcm16) // 2) / rate
        if turn.pcm16:
            turn_s = audio_s
            transcript = f"I heard you speak for {audio_s:.1f} seconds."
        elif turn.text:
            turn_s = len(turn.text) / TEXT_CHARS_PER_S
            n_words = len(turn.text.split())
            transcript = f"You wrote {n_words} word{'' if n_words == 1 else 's'}."
        else:
            turn_s = 0.0
            transcript = "I am listening."
        speed = min(max(float(turn.speed), 0.25), 1.5)
        if self.speech == "espeak-ng":
            return self._spoken(turn, transcript, speed, turn_s)
        duration = min(MAX_REPLY_S, (MIN_REPLY_S + PER_TURN_S * turn_s) / speed)
        steps = math.ceil(duration * 1000 / self.step_ms - 1e-9)
        total = steps * self.step_samples

        words = transcript.split()
        sylls = [_syllables(w) for w in words]
        count = sum(len(s) for s in sylls)
        active = total - round(TAIL_S * rate)
        syl_len = active / (count + WORD_GAP * (len(words) - 1))
        starts, formants, word_start = [], [], []
        t = 0.0
        for vowels in sylls:
            word_start.append(round(t))
            for v in vowels:
                starts.append(t)
                formants.append(VOWELS[v])
                t += syl_len
            t += WORD_GAP * syl_len
        syl_start = np.round(np.array(starts)).astype(np.int64)
        syl_end = syl_start + round(syl_len)
        form = np.array(formants)
        if turn.voice in ("coral", "sage", "shimmer", "marin"):
            form = form * 1.12  # a shorter vocal tract
        prev = np.vstack([form[:1], form[:-1]])

        base = BASE_PITCH_HZ.get(turn.voice, DEFAULT_PITCH_HZ)
        user_f0 = estimate_f0(turn.pcm16, rate) if turn.pcm16 else np.zeros(0)
        voiced = user_f0[user_f0 > 0]
        points = max(2, math.ceil(total / (rate * 0.01)) + 1)  # a point every 10 ms
        f0_times = np.linspace(0, total, points)
        if len(voiced) >= 3:
            track = _median_smooth(voiced)
            rel = np.clip(track / np.median(track), 0.5, 2.0)
            f0 = base * np.interp(np.linspace(0, 1, points), np.linspace(0, 1, len(rel)), rel)
        else:
            f0 = base * np.linspace(1.08, 0.92, points)

        seed = hashlib.sha256(
            turn.pcm16 + (turn.text or "").encode() + f"|{turn.voice}|{speed}".encode()
        ).digest()
        return VoiceState(
            words=words,
            transcript=transcript,
            total=total,
            f0_times=f0_times,
            f0_hz=np.clip(f0, F0_MIN, F0_MAX),
            syl_start=syl_start,
            syl_end=syl_end,
            syl_formants=form,
            prev_formants=prev,
            word_start=np.array(word_start, dtype=np.int64),
            rng=np.random.default_rng(int.from_bytes(seed[:8], "little")),
            duration_s=total / rate,
            turn_s=turn_s,
            user_f0=user_f0,
        )

    def _spoken(self, turn: VoiceTurn, transcript: str, speed: float, turn_s: float) -> SpokenState:
        """The transcript spoken by espeak-ng, at a pitch following the user's median F0."""
        base = BASE_PITCH_HZ.get(turn.voice, DEFAULT_PITCH_HZ)
        user_f0 = estimate_f0(turn.pcm16, self.sample_rate) if turn.pcm16 else np.zeros(0)
        voiced = user_f0[user_f0 > 0]
        median = float(np.median(voiced)) if len(voiced) >= 3 else None
        pitch = espeak.espeak_pitch(median, base)
        samples = espeak.synthesize(transcript, turn.voice, speed, pitch, self.sample_rate)
        steps = max(1, math.ceil(len(samples) / self.step_samples))
        pcm = np.zeros(steps * self.step_samples, np.int16)
        pcm[: len(samples)] = samples
        # Words are revealed in proportion to their place in the text, over the voiced span.
        loud = np.flatnonzero(np.abs(samples) > 300)
        first, last = (int(loud[0]), int(loud[-1])) if len(loud) else (0, len(samples))
        words = transcript.split()
        offsets = np.cumsum([0] + [len(w) + 1 for w in words[:-1]]) / max(len(transcript), 1)
        starts = (first + offsets * (last - first)).astype(np.int64)
        return SpokenState(words, transcript, pcm.astype("<i2").tobytes(), starts, turn_s)

    def done(self, state: VoiceState | SpokenState) -> bool:
        if isinstance(state, SpokenState):
            return state.pos >= len(state.pcm) // 2
        return state.pos >= state.total

    def step(self, state: VoiceState | SpokenState) -> VoiceChunk:
        if self.done(state):
            return VoiceChunk(b"", None)
        if isinstance(state, SpokenState):
            return self._step_spoken(state)
        rate = self.sample_rate
        n = np.arange(state.pos, min(state.pos + self.step_samples, state.total))
        f0 = np.interp(n, state.f0_times, state.f0_hz)
        phase = state.phase + np.cumsum(2 * np.pi * f0 / rate)
        state.phase = float(phase[-1] % (2 * np.pi))

        idx = np.searchsorted(state.syl_start, n, side="right") - 1
        inside = (idx >= 0) & (n < state.syl_end[np.maximum(idx, 0)])
        idx = np.maximum(idx, 0)
        length = (state.syl_end - state.syl_start)[idx]
        u = np.clip((n - state.syl_start[idx]) / length, 0.0, 1.0)
        ramp = np.minimum(1.0, np.minimum(u / 0.15, (1.0 - u) / 0.3))
        envelope = np.where(inside, 0.5 - 0.5 * np.cos(np.pi * ramp), 0.0)

        # The spectral envelope moves slowly: evaluate it every CONTROL samples.
        c = slice(None, None, CONTROL)
        glide = np.minimum(1.0, u[c] / 0.2)[:, None]
        prev, cur = state.prev_formants[idx[c]], state.syl_formants[idx[c]]
        formants = prev + (cur - prev) * glide
        harmonics = np.arange(1, int(MAX_HARMONIC_HZ / f0.min()) + 1)
        freq = f0[c, None] * harmonics[None, :]  # (control points, K)
        gain = (1.0 / harmonics)[None, :] * np.where(freq < MAX_HARMONIC_HZ, 1.0, 0.0)
        for i in range(3):
            fi, bi = formants[:, i : i + 1], BANDWIDTHS[i]
            gain = gain * fi**2 / np.sqrt((fi**2 - freq**2) ** 2 + (bi * freq) ** 2)
        gain /= np.sqrt(np.sum(gain**2, axis=1, keepdims=True) / 2) + 1e-12
        # The harmonic sum is the bulk of a step: in float32 (vectorised sin, ~10× faster
        # than float64; the phase error at 5 kHz stays under 1e-3 rad).
        gain32 = np.repeat(gain.astype(np.float32), CONTROL, axis=0)[: len(n)]
        angles = phase.astype(np.float32)[:, None] * harmonics.astype(np.float32)[None, :]
        voiced = np.einsum("tk,tk->t", gain32, np.sin(angles)).astype(np.float64)

        noise = np.diff(state.rng.standard_normal(len(n) + 1))  # white, high-passed
        burst = noise * np.clip(1.0 - u / 0.12, 0.0, 1.0) * inside * 0.35
        out = LEVEL * (voiced * envelope + burst)
        pcm = np.clip(np.round(out * 32767), -32768, 32767).astype("<i2").tobytes()

        return VoiceChunk(pcm, _advance(state, state.pos + len(n)))

    def _step_spoken(self, state: SpokenState) -> VoiceChunk:
        end = state.pos + self.step_samples
        pcm = state.pcm[state.pos * 2 : end * 2]
        return VoiceChunk(pcm, _advance(state, end))


def _advance(state: VoiceState | SpokenState, end: int) -> str | None:
    """Move ``state`` to sample ``end``: the transcript of the words that start before it
    (space-separated after the first word of the turn), None when no word does."""
    text = []
    while state.next_word < len(state.words) and state.word_start[state.next_word] < end:
        word = state.words[state.next_word]
        text.append(word if state.next_word == 0 else " " + word)
        state.next_word += 1
    state.pos = end
    return "".join(text) or None
