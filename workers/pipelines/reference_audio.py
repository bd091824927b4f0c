"""``reference/audio``: procedural text-to-audio with no learned weights.

Like ``reference/video`` it exists so audio jobs (API, broker, step executor, cancel,
encoding, streaming, storage) run, are tested and are benchmarked anywhere: CPU only,
nothing to download, bit-identical output for the same request and seed. It does not
understand language; prompt words are hashed into a piece of music. docs/reference-audio.md
describes it in full; in short:

* ``prepare`` composes the target at 24 kHz stereo: a melody with one note per prompt word
  (words in order, repeated to fill the clip; pitch from the word's hash on the scale,
  length from the word's length), a drone on the root and fifth, and texture beds for
  words such as "rain", "wind", "ocean"/"sea"/"waves" and "drum"/"beat". Dark words pick
  a minor scale; ``voice`` shifts the register, ``speed`` scales the tempo,
  ``guidance_scale`` sets the brightness (number of harmonics), ``instructions`` words
  join the prompt's, ``negative_prompt`` words are dropped, ``extra_params.bpm`` fixes the
  tempo. The seed varies octave jumps and panning. The target is average-pooled 8x (the
  stand-in for a VAE) into the latent target; latents start as Gaussian noise from
  ``numpy.random.default_rng(seed)``.
* ``step`` is one flow-matching Euler step ``x <- x + (s_next - s) * (x - x0_hat) / s`` on
  the shifted sigma schedule of reference/video; ``x0_hat`` is the latent target smoothed
  by a moving average whose width shrinks with the noise level (coarse to fine), and the
  last step lands exactly on the target (also with one step).
* ``decode`` holds each latent sample for 8 output samples and adds the full-rate detail
  band scaled by how far the sampler got, so a completed run returns the target exactly.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from models.catalog import REFERENCE_AUDIO
from models.errors import InvalidJobInput
from workers.pipelines.base import GenerationRequest, Media, NoWeights, Pipeline, StepState
from workers.pipelines.procedural import select_device

SAMPLE_RATE = 24_000
POOL = 8  # output samples per latent sample
_SHIFT = 3.0
_MAX_SMOOTH = 96  # moving-average width (latent samples) at sigma = 1
_DARK = {"dark", "sad", "night", "storm", "rain", "gloomy", "minor", "cold", "fear", "lonely",
         "grim", "shadow", "death", "melancholy", "slow", "winter"}  # fmt: skip
_MAJOR = (0, 2, 4, 5, 7, 9, 11)
_MINOR = (0, 2, 3, 5, 7, 8, 10)
_TEXTURES = {"rain": "rain", "storm": "rain", "drizzle": "rain", "wind": "wind",
             "breeze": "wind", "ocean": "sea", "sea": "sea", "waves": "sea", "surf": "sea",
             "drum": "drum", "drums": "drum", "beat": "drum", "rhythm": "drum"}  # fmt: skip


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(kw_only=True)
class ReferenceAudioState(StepState):
    target: np.ndarray  # float64 (2, n): the composed clip
    clean: np.ndarray  # float64 (2, ceil(n / POOL)): the latent target
    mean: np.ndarray  # (2, 1) mean of ``clean``
    latents: np.ndarray  # like ``clean``; Gaussian noise at step 0
    sigmas: np.ndarray  # num_steps + 1 values from 1 down to 0


class ReferenceAudioPipeline(NoWeights, Pipeline):
    """Procedural music and textures reached by a flow-matching Euler sampler loop."""

    spec = REFERENCE_AUDIO

    def load(self, device: str) -> None:
        """Check the device name; the model runs on the CPU with numpy either way."""
        select_device(device)

    def prepare(self, request: GenerationRequest) -> ReferenceAudioState:
        for key in request.extra:
            if key != "bpm":
                raise InvalidJobInput(
                    f"extra parameter {key!r} is not supported by reference/audio"
                )
        seconds = request.duration_s or 0.0
        if not 0 < seconds <= 3600:
            raise InvalidJobInput(f"seconds must be positive, got {seconds:g}")
        n = max(1, round(seconds * SAMPLE_RATE))
        target = compose(request, n)
        pad = -n % POOL
        clean = np.pad(target, ((0, 0), (0, pad)), mode="edge").reshape(2, -1, POOL).mean(axis=2)
        rng = np.random.default_rng(request.seed)
        sigmas = np.linspace(1.0, 0.0, request.num_inference_steps + 1)
        sigmas = _SHIFT * sigmas / (1 + (_SHIFT - 1) * sigmas)
        return ReferenceAudioState(
            num_steps=request.num_inference_steps,
            target=target,
            clean=clean,
            mean=clean.mean(axis=1, keepdims=True),
            latents=rng.standard_normal(clean.shape),
            sigmas=sigmas,
        )

    def step(self, state: StepState) -> None:
        st = _as_state(state)
        if st.done:
            raise RuntimeError("all denoise steps have already run")
        sigma = float(st.sigmas[st.step_index])
        sigma_next = float(st.sigmas[st.step_index + 1])
        if sigma_next > 0:
            width = 1 + round(sigma_next**2 * _MAX_SMOOTH)
            x0 = st.mean + (_smooth(st.clean, width) - st.mean) * (1 - 0.5 * sigma_next)
            st.latents += (st.latents - x0) * ((sigma_next - sigma) / sigma)
        else:
            st.latents = st.clean.copy()  # x + (0 - s) * (x - x0) / s == x0, exactly
        st.step_index += 1

    def decode(self, state: StepState) -> Media:
        st = _as_state(state)
        n = st.target.shape[1]
        detail = 1.0 - float(st.sigmas[st.step_index])  # 1 once all steps have run
        held = np.repeat(st.latents, POOL, axis=1)[:, :n]
        out = held + detail * (st.target - np.repeat(st.clean, POOL, axis=1)[:, :n])
        audio = np.clip(out, -1.0, 1.0).astype(np.float32)
        return Media.audio_only(audio, SAMPLE_RATE)


def _as_state(state: StepState) -> ReferenceAudioState:
    if not isinstance(state, ReferenceAudioState):
        raise TypeError(f"expected a ReferenceAudioState, got {type(state).__name__}")
    return state


def _smooth(x: np.ndarray, width: int) -> np.ndarray:
    """Centred moving average along time (edges averaged over what exists)."""
    if width <= 1:
        return x
    c = np.cumsum(np.pad(x, ((0, 0), (1, 0))), axis=1)
    n = x.shape[1]
    lo = np.clip(np.arange(n) - width // 2, 0, n)
    hi = np.clip(np.arange(n) + (width - width // 2), 0, n)
    return np.asarray((c[:, hi] - c[:, lo]) / (hi - lo))


# --- composition -------------------------------------------------------------------------


def _words(text: str | None) -> list[str]:
    return re.findall(r"[a-z0-9']+", (text or "").lower())


def compose(request: GenerationRequest, n: int) -> np.ndarray:
    """The clip the sampler converges to: float64 (2, n), peak 0.7, 10 ms fades."""
    opts = request.options
    banned = set(_words(request.negative_prompt))
    words = [
        w for w in _words(request.prompt) + _words(opts.get("instructions")) if w not in banned
    ]
    words = words or ["silence"]
    rng = np.random.default_rng([_hash(" ".join(words)), request.seed & (2**63 - 1)])
    t = np.arange(n) / SAMPLE_RATE
    scale = _MINOR if _DARK & set(words) else _MAJOR
    root = 48 + _hash(words[0]) % 12
    voice = opts.get("voice")
    if voice:
        root += int(_hash(str(voice)) % 12) - 5
    speed = float(opts.get("speed") or 1.0)
    bpm = float(request.extra.get("bpm") or 72 + _hash(" ".join(sorted(words))) % 60) * speed
    beat = 60.0 / bpm
    gs = opts.get("guidance_scale")
    harmonics = 3 if gs is None else int(np.clip(1 + round(float(gs) / 2.5), 1, 8))

    # Melody: one note per word, in order, repeated until the clip is full.
    starts, midis, pans = [0.0], [], []
    i = 0
    while starts[-1] < n / SAMPLE_RATE:
        w = words[i % len(words)]
        h = _hash(w)
        octave = 12 * int(rng.integers(0, 2))
        midis.append(root + 12 + scale[h % 7] + octave)
        pans.append(float(rng.uniform(0.15, 0.85)))
        starts.append(starts[-1] + beat * (1 if len(w) <= 3 else 2 if len(w) <= 6 else 3) / 2)
        i += 1
    edges = np.asarray(starts)
    note = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(midis) - 1)
    since = t - edges[note]
    length = (edges[1:] - edges[:-1])[note]
    freq = 440.0 * 2 ** ((np.asarray(midis, dtype=np.float64)[note] - 69) / 12)
    phase = 2 * np.pi * np.cumsum(freq) / SAMPLE_RATE
    tone = sum(np.sin(k * phase) / k for k in range(1, harmonics + 1))
    env = np.clip(since / 0.01, 0, 1) * np.exp(-2.5 * since / length)
    env *= np.clip((length - since) / 0.02, 0, 1)
    melody = 0.35 * tone * env
    pan = np.asarray(pans)[note] * np.pi / 2
    mix = np.stack([melody * np.cos(pan), melody * np.sin(pan)]) * np.sqrt(2)

    # Drone on the root and the fifth.
    drone = 0.08 * (np.sin(2 * np.pi * _hz(root) * t) + 0.7 * np.sin(2 * np.pi * _hz(root + 7) * t))
    mix += drone

    for texture in sorted({_TEXTURES[w] for w in words if w in _TEXTURES}):
        mix += _texture(texture, t, beat, rng)

    peak = float(np.abs(mix).max())
    fade = np.clip(np.minimum(t, t[::-1]) / 0.01, 0, 1)
    return np.asarray(mix * fade * (0.7 / peak if peak > 0 else 1.0))


def _hz(midi: float) -> float:
    return float(440.0 * 2 ** ((midi - 69) / 12))


def _texture(kind: str, t: np.ndarray, beat: float, rng: np.random.Generator) -> np.ndarray:
    n = t.shape[0]
    noise = rng.standard_normal((2, n))
    if kind == "rain":  # bright crackle: differenced noise with sparse drops
        drops = (rng.random((2, n)) < 0.002) * rng.uniform(0.2, 1.0, (2, n))
        return 0.04 * np.diff(noise, prepend=0.0, axis=1) + 0.3 * drops
    if kind == "wind":  # dark noise, slowly swelling
        swell = 0.5 + 0.5 * np.sin(2 * np.pi * 0.2 * t + np.array([[0.0], [1.3]]))
        return 0.25 * _smooth(noise, 48) * swell
    if kind == "sea":  # waves every ~8 s
        swell = (0.5 + 0.5 * np.sin(2 * np.pi * t / 8.0)) ** 2
        return 0.3 * _smooth(noise, 12) * swell
    # drum: a decaying low sine on every beat
    tb = t % beat
    kick = np.sin(2 * np.pi * (50 + 80 * np.exp(-tb / 0.03)) * tb) * np.exp(-tb / 0.12)
    return np.stack([0.5 * kick, 0.5 * kick])
