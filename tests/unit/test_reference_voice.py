"""The weight-free ``reference/voice`` responder: length, pitch, transcript, determinism."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from models.registry import BUILTIN_MODELS
from tests.unit.reference_fixtures import loaded
from workers.pipelines import espeak
from workers.pipelines.base import VoiceChunk, VoicePipeline, VoiceTurn
from workers.pipelines.reference_voice import (
    BASE_PITCH_HZ,
    ReferenceVoicePipeline,
    VoiceState,
    estimate_f0,
)
from workers.pipelines.registry import build_adapter

RATE = 24000
STEP_BYTES = RATE * 40 // 1000 * 2


def _tone(f0_start: float, f0_end: float, seconds: float) -> bytes:
    """A harmonic complex gliding from f0_start to f0_end (a stand-in for a voiced turn)."""
    n = int(seconds * RATE)
    f0 = np.linspace(f0_start, f0_end, n)
    phase = np.cumsum(2 * np.pi * f0 / RATE)
    x = sum(np.sin(k * phase) / k for k in range(1, 8))
    x = 0.3 * x / np.max(np.abs(x))
    return (x * 32767).astype("<i2").tobytes()


def _turn(pcm16: bytes = b"", text: str | None = None, voice: str = "alloy", speed: float = 1.0):
    return VoiceTurn(pcm16=pcm16, text=text, voice=voice, speed=speed, instructions=None)


def _run(pipe: ReferenceVoicePipeline, turn: VoiceTurn) -> tuple[VoiceState, list[VoiceChunk]]:
    state = pipe.start_response(turn)
    chunks = []
    while not pipe.done(state):
        chunks.append(pipe.step(state))
    return state, chunks


@pytest.fixture(scope="module")
def pipe() -> ReferenceVoicePipeline:
    return loaded(ReferenceVoicePipeline)


def test_registered_as_a_streaming_audio_model() -> None:
    model = BUILTIN_MODELS["reference/voice"]
    assert model.spec.modality == "audio"
    assert model.spec.streaming
    adapter = build_adapter(model)
    assert isinstance(adapter, VoicePipeline)
    assert isinstance(adapter, ReferenceVoicePipeline)


def test_same_turn_same_bytes(pipe: ReferenceVoicePipeline) -> None:
    turn = _turn(_tone(120, 180, 1.5))
    _, a = _run(pipe, turn)
    _, b = _run(pipe, turn)
    assert a == b
    _, other = _run(pipe, _turn(_tone(120, 180, 1.5), voice="coral"))
    assert b"".join(c.pcm16 for c in other) != b"".join(c.pcm16 for c in a)


@pytest.mark.parametrize(
    ("turn", "seconds"),
    [
        (_turn(b"\x00\x00" * RATE * 2), 0.6 + 0.5 * 2.0),
        (_turn(b"\x00\x00" * RATE * 2, speed=0.5), (0.6 + 0.5 * 2.0) / 0.5),
        (_turn(b"\x00\x00" * RATE * 30), 6.0),  # capped
        (_turn(text="hello there, how are you"), 0.6 + 0.5 * 24 / 15),
        (_turn(), 0.6),
    ],
    ids=["audio", "slow", "capped", "text", "empty"],
)
def test_length_follows_the_turn(
    pipe: ReferenceVoicePipeline, turn: VoiceTurn, seconds: float
) -> None:
    state, chunks = _run(pipe, turn)
    steps = int(np.ceil(round(seconds * 1000, 6) / 40))
    assert len(chunks) == steps
    assert all(len(c.pcm16) == STEP_BYTES for c in chunks)  # every step is step_ms long
    assert state.total == steps * 960


def test_transcript_is_revealed_word_by_word(pipe: ReferenceVoicePipeline) -> None:
    state, chunks = _run(pipe, _turn(b"\x00\x00" * int(RATE * 1.4)))
    assert state.transcript == "I heard you speak for 1.4 seconds."
    deltas = [c.text for c in chunks if c.text]
    assert "".join(deltas) == state.transcript
    assert chunks[0].text == "I"
    assert len(deltas) == len(state.transcript.split())  # one word per delta here
    _, text_chunks = _run(pipe, _turn(text="one two three"))
    assert "".join(c.text or "" for c in text_chunks) == "You wrote 3 words."
    _, empty = _run(pipe, _turn())
    assert "".join(c.text or "" for c in empty) == "I am listening."


def test_audio_is_speech_like(pipe: ReferenceVoicePipeline) -> None:
    _, chunks = _run(pipe, _turn(_tone(150, 150, 2.0)))
    x = np.frombuffer(b"".join(c.pcm16 for c in chunks), "<i2") / 32768
    rms = np.sqrt(np.mean(x**2))
    assert 0.05 < rms < 0.4
    # Syllables: the 20 ms energy envelope rises and falls many times, with pauses.
    env = np.sqrt(np.mean(x[: len(x) // 480 * 480].reshape(-1, 480) ** 2, axis=1))
    loud = env > 0.5 * np.median(env[env > 0.01])
    assert np.sum(np.diff(loud.astype(int)) == 1) >= 5
    assert np.sum(env < 0.01) >= 4  # word gaps and the closing silence


def test_f0_estimate_of_a_steady_tone() -> None:
    f0 = estimate_f0(_tone(150, 150, 1.0), RATE)
    assert np.all(np.abs(f0 - 150) < 4)
    assert not np.any(estimate_f0(b"\x00\x00" * RATE, RATE))


def _f0_trend(pcm: bytes) -> float:
    """Mean F0 of the answer's last third over its first third (voiced frames only)."""
    f0 = estimate_f0(pcm, RATE)
    thirds = np.array_split(f0, 3)
    first, last = thirds[0][thirds[0] > 0], thirds[2][thirds[2] > 0]
    return float(np.median(last) / np.median(first))


def test_pitch_contour_follows_the_user(pipe: ReferenceVoicePipeline) -> None:
    rising = _run(pipe, _turn(_tone(100, 200, 3.0)))
    falling = _run(pipe, _turn(_tone(200, 100, 3.0)))
    up = _f0_trend(b"".join(c.pcm16 for c in rising[1]))
    down = _f0_trend(b"".join(c.pcm16 for c in falling[1]))
    assert up > 1.3
    assert down < 1 / 1.3
    # The contour is the user's shape on the voice's own base pitch.
    assert rising[0].user_f0[rising[0].user_f0 > 0][0] == pytest.approx(100, abs=5)


def test_without_voiced_input_the_voice_base_pitch_is_used(pipe: ReferenceVoicePipeline) -> None:
    for voice in ("ash", "shimmer"):
        _, chunks = _run(pipe, _turn(text="what is the weather like today", voice=voice))
        f0 = estimate_f0(b"".join(c.pcm16 for c in chunks), RATE)
        assert np.median(f0[f0 > 0]) == pytest.approx(BASE_PITCH_HZ[voice], rel=0.1)


FAKE_ESPEAK = r'''#!{python}
"""A stand-in for espeak-ng: records its arguments, writes 1.5 s of a 22.05 kHz tone."""
import io, json, math, os, sys, wave
open(os.environ["FAKE_ESPEAK_LOG"], "a").write(json.dumps(sys.argv[1:]) + "\n")
n = int(22050 * 1.5)
frames = b"".join(
    int(8000 * math.sin(2 * math.pi * 200 * i / 22050)).to_bytes(2, "little", signed=True)
    if 2205 <= i < n - 2205 else b"\x00\x00"
    for i in range(n)
)
out = io.BytesIO()
with wave.open(out, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(22050); w.writeframes(frames)
sys.stdout.buffer.write(out.getvalue())
'''


def test_espeak_speech_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``speech="espeak-ng"`` without the bundled library speaks the transcript through
    the espeak-ng command line (a fake binary here: the real one is optional): arguments,
    24 kHz resampling, whole 40 ms steps, words revealed over the audio."""
    fake = tmp_path / "espeak-ng"
    fake.write_text(FAKE_ESPEAK.replace("{python}", sys.executable))
    fake.chmod(0o755)
    log = tmp_path / "args.jsonl"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ESPEAK_LOG", str(log))
    monkeypatch.setattr(espeak, "has_library", lambda: False)  # the binary, not the library
    monkeypatch.setattr(espeak, "_library", None)
    pipe = ReferenceVoicePipeline(speech="espeak-ng")
    pipe.load("cpu")
    turn = VoiceTurn(
        pcm16=_tone(240, 240, 1.0), text=None, voice="marin", speed=1.2, instructions=None
    )
    state = pipe.start_response(turn)
    chunks = []
    while not pipe.done(state):
        chunks.append(pipe.step(state))
    args = json.loads(log.read_text().splitlines()[0])
    assert args[:7] == ["--stdout", "-v", "en-us+f3", "-s", "210", "-p", args[6]]
    assert int(args[6]) > 50  # the user spoke above marin's base pitch
    assert args[7] == "I heard you speak for 1.0 seconds."
    assert all(len(c.pcm16) == STEP_BYTES for c in chunks)
    assert len(chunks) == -(-int(1.5 * RATE) // (STEP_BYTES // 2))
    assert "".join(c.text or "" for c in chunks) == args[7]
    pcm = np.frombuffer(b"".join(c.pcm16 for c in chunks), "<i2")
    assert np.abs(pcm[: int(0.08 * RATE)]).max() < 200 and np.abs(pcm).max() > 6000


@pytest.mark.skipif(not espeak.has_library(), reason="needs the speech extra")
def test_espeak_speech_option_with_the_bundled_library() -> None:
    """With the ``speech`` extra the same option speaks through libespeak-ng: real speech,
    the same bytes for the same turn."""
    pipe = ReferenceVoicePipeline(speech="espeak-ng")
    pipe.load("cpu")
    turn = _turn(text="what is the weather like today", voice="echo")
    first = b"".join(c.pcm16 for c in _run(pipe, turn)[1])
    assert b"".join(c.pcm16 for c in _run(pipe, turn)[1]) == first
    pcm = np.frombuffer(first, "<i2")
    assert len(pcm) > RATE and np.abs(pcm).max() > 6000


def test_speech_option_is_checked() -> None:
    with pytest.raises(ValueError, match="speech"):
        ReferenceVoicePipeline(speech="festival")
