"""``reference/speech``: eSpeak NG (the bundled library) speaks the input, one phrase per
step. The checks are what tells speech from a tune: the length follows the text, the
loudness rises and falls at the syllable rate, the pitch follows the voice."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from models.errors import InvalidJobInput
from tests.speech_measures import median_f0, syllabic_peak_hz
from tests.unit.job_steps import run_job
from tests.unit.reference_fixtures import loaded
from workers.pipelines import espeak
from workers.pipelines.base import GenerationRequest
from workers.pipelines.reference_speech import (
    MAX_WORDS,
    SAMPLE_RATE,
    VOICES,
    ReferenceSpeechPipeline,
    phrases,
    voice_of,
)

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs away into the forest. "
    "Nobody saw where it went."
)

pytestmark = pytest.mark.skipif(not espeak.has_library(), reason="needs the speech extra")


def _request(text: str = TEXT, **options: Any) -> GenerationRequest:
    return GenerationRequest.audio(
        prompt=text, duration_s=5.0, num_inference_steps=1, seed=3, options=options
    )


def _speak(pipe: ReferenceSpeechPipeline, text: str = TEXT, **options: Any) -> np.ndarray:
    media = run_job(pipe, _request(text, **options))
    assert media.audio is not None and media.sample_rate == SAMPLE_RATE
    assert media.audio.shape[0] == 1 and media.audio.dtype == np.float32
    return media.audio[0]


def f0(pipe: ReferenceSpeechPipeline, voice: str) -> float:
    return median_f0(_speak(pipe, voice=voice), SAMPLE_RATE)


@pytest.fixture(scope="module")
def pipe() -> ReferenceSpeechPipeline:
    return loaded(ReferenceSpeechPipeline)


def test_duration_grows_with_the_text(pipe: ReferenceSpeechPipeline) -> None:
    lengths = [
        len(_speak(pipe, text)) / SAMPLE_RATE
        for text in ("Hello.", "Hello, how are you today?", TEXT, f"{TEXT} {TEXT}")
    ]
    assert lengths == sorted(lengths) and len(set(lengths)) == 4
    assert 0.3 < lengths[0] < 1.5
    # about espeak's 175 words/min: 21 words in 5-10 s, twice the text twice as long
    assert 5.0 < lengths[2] < 10.0
    assert lengths[3] == pytest.approx(2 * lengths[2], rel=0.05)


def test_speed_is_the_rate(pipe: ReferenceSpeechPipeline) -> None:
    normal, fast = len(_speak(pipe)), len(_speak(pipe, speed=2.0))
    assert 0.4 < fast / normal < 0.65


def test_syllabic_envelope_has_its_energy_at_2_to_8_hz(pipe: ReferenceSpeechPipeline) -> None:
    """Speech's loudness rises and falls with its syllables, 2-8 times a second; a tune's
    envelope is flat or follows its notes."""
    peak, share = syllabic_peak_hz(_speak(pipe), SAMPLE_RATE)
    assert 2 <= peak <= 8 and share > 0.5, (peak, share)


def test_same_text_same_audio(pipe: ReferenceSpeechPipeline) -> None:
    a = _speak(pipe, voice="nova")
    assert np.array_equal(a, _speak(pipe, voice="nova"))
    other_seed = GenerationRequest.audio(
        prompt=TEXT, duration_s=9.0, num_inference_steps=4, seed=99, options={"voice": "nova"}
    )
    media = run_job(pipe, other_seed)
    assert media.audio is not None and np.array_equal(media.audio[0], a)
    assert len(_speak(pipe, "Something else entirely.", voice="nova")) < len(a) / 2


def test_a_different_voice_has_a_different_pitch(pipe: ReferenceSpeechPipeline) -> None:
    low, high = f0(pipe, "onyx"), f0(pipe, "shimmer")
    assert 60 < low < 160 and 160 < high < 400
    assert high > 1.5 * low
    echo, nova = f0(pipe, "echo"), f0(pipe, "nova")
    assert nova > 1.3 * echo


def test_voices_map_deterministically() -> None:
    assert voice_of(None) == voice_of("alloy") == VOICES["alloy"]
    assert voice_of("NOVA ") == VOICES["nova"]
    assert voice_of("my-own-voice") == voice_of("my-own-voice") in VOICES.values()
    assert len({(v.variant, v.pitch) for v in VOICES.values()}) == len(VOICES)


def test_phrases() -> None:
    assert phrases("Hi there, friend. How are you?\nFine!") == [
        "Hi there,",
        "friend.",
        "How are you?",
        "Fine!",
    ]
    long = " ".join(f"w{i}" for i in range(2 * MAX_WORDS + 1))
    assert [len(p.split()) for p in phrases(long)] == [MAX_WORDS, MAX_WORDS, 1]
    assert phrases(" $5 ... !? ") == ["$5 ...", "!?"]
    assert phrases(" \n ") == []


def test_one_step_per_phrase_and_the_pieces_are_the_clip(pipe: ReferenceSpeechPipeline) -> None:
    """Each step speaks one phrase; ``take_audio`` hands out each new piece once, and the
    pieces joined are what ``decode`` returns."""
    state = pipe.prepare(_request())
    assert state.num_steps == len(phrases(TEXT)) == 3
    pieces = []
    while not state.done:
        pipe.step(state)
        taken = pipe.take_audio(state)
        assert taken is not None and taken[1] == SAMPLE_RATE
        assert taken[0].shape[1] > 0.2 * SAMPLE_RATE  # a phrase's worth, at once
        pieces.append(taken[0])
        empty = pipe.take_audio(state)
        assert empty is not None and empty[0].shape == (1, 0)
    media = pipe.decode(state)
    assert media.audio is not None
    assert np.array_equal(np.concatenate(pieces, axis=1), media.audio)
    with pytest.raises(RuntimeError):
        pipe.step(state)


def test_a_stop_between_steps_leaves_the_rest_unspoken(pipe: ReferenceSpeechPipeline) -> None:
    """What a cancel after the first step finds: one phrase spoken, nothing made for the
    others (the executor checks for a cancel between steps; a step is one phrase)."""
    state = pipe.prepare(_request())
    pipe.step(state)
    assert state.step_index == 1 and not state.done and len(state.pieces) == 1
    whole = _speak(pipe)
    first = pipe.decode(state).audio
    assert first is not None and 0 < first.shape[1] < len(whole) / 2
    assert np.array_equal(first[0], whole[: first.shape[1]])


def test_the_clip_is_cut_at_max_seconds() -> None:
    short = loaded(ReferenceSpeechPipeline)
    short.spec = short.spec.model_copy(update={"max_seconds": 2.0})
    media = run_job(short, _request())
    assert media.audio is not None and media.audio.shape[1] == 2 * SAMPLE_RATE


def test_bad_input_is_refused(pipe: ReferenceSpeechPipeline) -> None:
    with pytest.raises(InvalidJobInput, match="nothing to speak"):
        pipe.prepare(_request(" \n "))
    with pytest.raises(InvalidJobInput, match="bpm"):
        pipe.prepare(
            GenerationRequest.audio(
                prompt="hi", duration_s=1.0, num_inference_steps=1, seed=0, extra={"bpm": 90}
            )
        )


def test_a_dead_helper_is_started_again(pipe: ReferenceSpeechPipeline) -> None:
    """The library runs in a helper process; if it dies, the next call starts another and
    the speech is the same."""
    before = _speak(pipe, "Hello there.")
    lib = espeak._get_library()
    assert lib is not None and lib.proc is not None
    lib.proc.kill()
    lib.proc.wait()
    assert np.array_equal(_speak(pipe, "Hello there."), before)


def test_the_library_and_the_binary_speak_alike_when_both_exist() -> None:
    """The binary is optional here; where it is installed it must keep the engines'
    shared contract, whatever eSpeak NG version each is (the bundled library and a
    distribution's binary differ by up to a fifth in length): audible int16 speech, of
    the same order of length, that both speed up alike when the rate doubles."""
    if not espeak.has_binary():
        pytest.skip("espeak-ng is not on PATH")
    voice, text = VOICES["echo"], "Hello there, friend. How are you today?"
    speedups = []
    for speak in (espeak.speak_all, espeak._binary):
        normal, fast = speak(text, voice, 175), speak(text, voice, 350)
        assert normal.dtype == np.int16 and np.abs(normal).max() > 1000
        speedups.append(len(fast) / len(normal))
    assert all(0.2 < s < 0.7 for s in speedups)  # twice the rate: well under the length
    assert abs(speedups[0] - speedups[1]) < 0.1
    lib, binary = espeak.speak_all(text, voice, 175), espeak._binary(text, voice, 175)
    assert 0.5 < len(lib) / len(binary) < 2.0


def test_language_speaks_with_espeak_s_voice_of_that_language(
    pipe: ReferenceSpeechPipeline,
) -> None:
    """``language`` (the API's ISO code) picks eSpeak NG's voice of that language: French
    says "bonjour" otherwise than English, which is also what no language says."""
    english = _speak(pipe, "bonjour madame", voice="alloy")
    assert np.array_equal(_speak(pipe, "bonjour madame", voice="alloy", language="en"), english)
    french = _speak(pipe, "bonjour madame", voice="alloy", language="fr")
    assert french.shape != english.shape or not np.array_equal(french, english)
    state = pipe.prepare(_request("ni hao", voice="alloy", language="zh"))
    assert state.voice.name == "cmn+" + voice_of("alloy").variant
    with pytest.raises(InvalidJobInput, match="language 'xx'"):
        pipe.prepare(_request("hi", language="xx"))
