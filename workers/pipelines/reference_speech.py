"""``reference/speech``: text-to-speech with no learned weights, through eSpeak NG
(:mod:`workers.pipelines.espeak`: the bundled library of the ``speech`` extra, else the
``espeak-ng`` binary).

It is the default model of ``/v1/audio/speech``: it speaks the request's ``input``.

* ``prepare`` splits the input into phrases (at ``, ; : . ! ?`` and line breaks, a phrase
  of more than :data:`MAX_WORDS` words into pieces of that many) and picks the espeak voice
  (:data:`VOICES`: each OpenAI voice name is a variant and a pitch; any other name one of
  them by its hash), in the request's ``language`` (:data:`LANGUAGES`; English when none),
  and the rate (175 words/min × ``speed``).
* ``step`` speaks one phrase (espeak adds its own pause after the punctuation), so
  progress, cancel and the PCM stream advance phrase by phrase; ``take_audio`` hands out
  what the steps made since it was last asked.
* ``decode`` returns the phrases joined, 22.05 kHz mono (the executor resamples to the
  artifact's rate), cut at the model's ``max_seconds``.

``seed``, ``num_inference_steps`` and ``seconds`` do not change the output: the same input,
voice and speed give the same samples, and the clip is as long as the speech.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace

import numpy as np

from models.catalog import REFERENCE_SPEECH
from models.errors import InvalidJobInput
from workers.pipelines import espeak
from workers.pipelines.base import GenerationRequest, Media, NoWeights, Pipeline, StepState
from workers.pipelines.procedural import select_device

SAMPLE_RATE = espeak.ESPEAK_RATE
MAX_WORDS = 12
DEFAULT_VOICE = "alloy"
# OpenAI's voices → an espeak variant (voices/!v) and pitch (0-99; 50 is the variant's own).
VOICES: dict[str, espeak.Voice] = {
    "alloy": espeak.Voice("f2", pitch=50),
    "ash": espeak.Voice("m3", pitch=42),
    "ballad": espeak.Voice("m5", pitch=55),
    "coral": espeak.Voice("f3", pitch=58),
    "echo": espeak.Voice("m1", pitch=35),
    "fable": espeak.Voice("m4", pitch=50),
    "onyx": espeak.Voice("m2", pitch=25),
    "nova": espeak.Voice("f4", pitch=65),
    "sage": espeak.Voice("f1", pitch=55),
    "shimmer": espeak.Voice("f5", pitch=70),
    "verse": espeak.Voice("m6", pitch=45),
    "marin": espeak.Voice("f3", pitch=48),
    "cedar": espeak.Voice("m7", pitch=30),
}
_PHRASE = re.compile(r"[^,;:.!?\n]+[,;:.!?]*")


@dataclass(kw_only=True)
class SpeechState(StepState):
    phrases: list[str]
    voice: espeak.Voice
    words_per_minute: int
    max_samples: int
    pieces: list[np.ndarray] = field(default_factory=list)  # int16, one per spoken phrase
    taken: int = 0  # pieces handed out by take_audio
    length: int = 0  # samples spoken so far

    def audio(self, start: int = 0) -> np.ndarray:
        """Pieces ``start:`` as float32 (1, n) in [-1, 1]."""
        parts = self.pieces[start:]
        joined = np.concatenate(parts) if parts else np.zeros(0, np.int16)
        return (joined.astype(np.float32) / 32768.0)[None, :]


# A request's ``language`` (the API's ISO 639-1 code, models.audio.SPEECH_LANGUAGES) →
# eSpeak NG's voice language: its data bundles every one of these dictionaries.
LANGUAGES = {
    "en": "en-us",
    "zh": "cmn",
    "ja": "ja",
    "ko": "ko",
    "fr": "fr",
    "de": "de",
    "es": "es",
    "it": "it",
    "pt": "pt",
    "ru": "ru",
}


def voice_of(name: str | None) -> espeak.Voice:
    """The espeak voice of an OpenAI voice name; another name picks one by its hash."""
    name = (name or DEFAULT_VOICE).strip().lower()
    if name in VOICES:
        return VOICES[name]
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    keys = sorted(VOICES)
    return VOICES[keys[int.from_bytes(digest, "little") % len(keys)]]


def phrases(text: str) -> list[str]:
    """The input cut at punctuation and line breaks, no phrase over MAX_WORDS words."""
    out: list[str] = []
    for match in _PHRASE.finditer(text):
        words = match.group(0).split()
        out += [" ".join(words[i : i + MAX_WORDS]) for i in range(0, len(words), MAX_WORDS)]
    return [p for p in out if p]  # symbols too: espeak says "$" as "dollar"


class ReferenceSpeechPipeline(NoWeights, Pipeline):
    """eSpeak NG, one phrase per step."""

    spec = REFERENCE_SPEECH

    def load(self, device: str) -> None:
        """Check the device name and that an eSpeak NG engine is installed (it runs on the
        CPU whatever the device)."""
        select_device(device)
        if not espeak.available():
            raise RuntimeError(
                "reference/speech needs eSpeak NG: pip install 'omniqueue[speech]' "
                "(espeakng-loader) or put espeak-ng on PATH"
            )
        espeak.start()

    def prepare(self, request: GenerationRequest) -> SpeechState:
        for key in request.extra:
            raise InvalidJobInput(f"extra parameter {key!r} is not supported by reference/speech")
        spoken = phrases(request.prompt or "")
        if not spoken:
            raise InvalidJobInput("input has nothing to speak")
        opts = request.options
        voice = voice_of(opts["voice"] if isinstance(opts.get("voice"), str) else None)
        language = opts.get("language")
        if language is not None:
            if language not in LANGUAGES:
                raise InvalidJobInput(f"language {language!r} is not spoken here")
            voice = replace(voice, language=LANGUAGES[language])
        speed = float(opts.get("speed") or 1.0)
        top = self.spec.max_seconds or REFERENCE_SPEECH.max_seconds or 120.0
        return SpeechState(
            num_steps=len(spoken),
            phrases=spoken,
            voice=voice,
            words_per_minute=espeak.words_per_minute(speed),
            max_samples=round(top * SAMPLE_RATE),
        )

    def step(self, state: StepState) -> None:
        st = _as_state(state)
        if st.done:
            raise RuntimeError("every phrase has already been spoken")
        piece = espeak.speak_all(st.phrases[st.step_index], st.voice, st.words_per_minute)
        piece = piece[: st.max_samples - st.length]
        st.pieces.append(piece)
        st.length += len(piece)
        st.step_index += 1
        if st.length >= st.max_samples:
            st.step_index = st.num_steps  # the clip is full: the rest is not spoken

    def take_audio(self, state: StepState) -> tuple[np.ndarray, int] | None:
        st = _as_state(state)
        start, st.taken = st.taken, len(st.pieces)
        return st.audio(start), SAMPLE_RATE

    def decode(self, state: StepState) -> Media:
        st = _as_state(state)
        return Media.audio_only(st.audio(), SAMPLE_RATE)


def _as_state(state: StepState) -> SpeechState:
    if not isinstance(state, SpeechState):
        raise TypeError(f"expected a SpeechState, got {type(state).__name__}")
    return state
