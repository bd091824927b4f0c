"""Server VAD (silero-vad) on the committed espeak-ng speech fixtures."""

from __future__ import annotations

import json
import threading
import warnings
import wave
from pathlib import Path

import numpy as np
import pytest

from realtime.vad import Net, SileroVAD, VadEvent, _Resampler, warm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "speech"
TRUTH = json.loads((FIXTURES / "fixtures.json").read_text())["fixtures"]
# Measured on these fixtures (default settings): onsets 7-104 ms after the true onset (the
# latest is the fricative of "Stop"), offsets 59-120 ms after the true offset (silero's
# probability decays over 2-3 frames of 32 ms after speech ends).
ONSET_TOLERANCE_MS = 150
OFFSET_TOLERANCE_MS = 150
PIECE = 4800  # bytes: 100 ms of 24 kHz PCM16


def _pcm(name: str) -> bytes:
    with wave.open(str(FIXTURES / name)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return w.readframes(w.getnframes())


def _feed(vad: SileroVAD, pcm: bytes, piece: int | None = None) -> list[VadEvent]:
    if piece is None:
        return vad.feed(pcm)
    events: list[VadEvent] = []
    for i in range(0, len(pcm), piece):
        events += vad.feed(pcm[i : i + piece])
    return events


@pytest.mark.parametrize("fixture", TRUTH, ids=[f["file"] for f in TRUTH])
def test_one_turn_per_utterance_near_the_true_boundaries(fixture: dict[str, int]) -> None:
    vad = SileroVAD()
    events = _feed(vad, _pcm(str(fixture["file"])), PIECE)
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"]
    started, stopped = events
    assert abs(started.audio_ms - fixture["onset_ms"]) <= ONSET_TOLERANCE_MS
    assert 0 <= stopped.audio_ms - fixture["offset_ms"] <= OFFSET_TOLERANCE_MS
    assert not vad.speaking
    assert abs(vad.position_ms - fixture["duration_ms"]) <= 1  # floor vs round


@pytest.mark.parametrize("dbfs", [None, -60.0, -40.0, -20.0])
def test_silence_and_noise_give_no_events(dbfs: float | None) -> None:
    rng = np.random.default_rng(7)
    n = 24000 * 3
    x = np.zeros(n) if dbfs is None else rng.standard_normal(n) * 10 ** (dbfs / 20)
    pcm = np.clip(x * 32767, -32768, 32767).astype("<i2").tobytes()
    vad = SileroVAD()
    assert _feed(vad, pcm, PIECE) == []
    assert not vad.speaking
    assert vad.position_ms == 3000


def test_piece_size_does_not_change_the_events() -> None:
    pcm = _pcm("hello.wav") + _pcm("stop.wav")
    whole = _feed(SileroVAD(), pcm)
    assert [e.kind for e in whole] == ["speech_started", "speech_stopped"] * 2
    assert _feed(SileroVAD(), pcm, PIECE) == whole
    assert _feed(SileroVAD(), pcm, 4801) == whole  # odd byte counts: half samples carried


def test_a_lone_byte_is_kept_for_the_next_feed() -> None:
    vad = SileroVAD()
    assert vad.feed(b"\x01") == []
    assert vad.position_ms == 0
    assert vad.feed(b"\x00" * 4799) == []
    assert vad.position_ms == 100


def test_speaking_and_position_follow_the_input() -> None:
    fixture = TRUTH[0]
    pcm = _pcm(str(fixture["file"]))
    vad = SileroVAD()
    middle = (fixture["onset_ms"] + fixture["offset_ms"]) // 2 * 48  # bytes at 24 kHz PCM16
    first = vad.feed(pcm[:middle])
    assert [e.kind for e in first] == ["speech_started"]
    assert vad.speaking
    assert vad.position_ms == middle // 48
    assert [e.kind for e in vad.feed(pcm[middle:])] == ["speech_stopped"]


def test_configure_changes_the_silence_that_ends_a_turn() -> None:
    pcm = _pcm("hello.wav")  # "Hello, can you hear me?": a short pause after the comma
    # A longer silence than the file's tail: the turn never ends.
    vad = SileroVAD(silence_duration_ms=2000)
    assert [e.kind for e in vad.feed(pcm)] == ["speech_started"]
    assert vad.speaking
    # Reconfigured mid-stream to 100 ms: the comma pause now splits the turn in two.
    vad = SileroVAD()
    events = vad.feed(pcm[: 500 * 48])
    vad.configure(threshold=0.5, silence_duration_ms=100)
    events += vad.feed(pcm[500 * 48 :])
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"] * 2
    assert _feed(SileroVAD(), pcm) != events


def test_configure_threshold() -> None:
    pcm = _pcm("stop.wav")
    default = SileroVAD().feed(pcm)
    strict = SileroVAD()
    strict.configure(threshold=0.999, silence_duration_ms=500)
    events = strict.feed(pcm)
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"]
    assert events[0].audio_ms > default[0].audio_ms  # needs a surer frame to start


class _TorchScriptNet(Net):
    """silero's own TorchScript release of the network (the silero-vad wheel, dev extra),
    as a reference for the ONNX file the API tier runs."""

    def __init__(self) -> None:
        import importlib.util

        import torch

        spec = importlib.util.find_spec("silero_vad")  # its __init__ would set torch threads
        assert spec is not None and spec.submodule_search_locations
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.jit"
        self._torch = torch
        with warnings.catch_warnings():
            # torch 2.10+ deprecates TorchScript loading; the wheel ships this format
            warnings.filterwarnings("ignore", "`torch.jit.load` is deprecated", DeprecationWarning)
            full = torch.jit.load(str(path), map_location="cpu")
        self._net = full._model  # the wrapper around it keeps state on itself: skip it
        self._net.eval()

    def __call__(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        with self._torch.inference_mode():
            p, out = self._net(self._torch.from_numpy(x), self._torch.from_numpy(state))
        return float(p), out.numpy()


def test_vendored_onnx_weights_agree_with_silero_torchscript() -> None:
    pcm = _pcm("weather.wav")
    onnx = _feed(SileroVAD(), pcm, PIECE)
    torch = _feed(SileroVAD(net=warm(_TorchScriptNet())), pcm, PIECE)
    assert onnx == torch
    assert len(onnx) == 2


def test_detectors_fed_from_threads_match_serial_runs() -> None:
    """The loaded network is shared; each detector keeps its own recurrent state."""
    names = [str(f["file"]) for f in TRUTH] * 2
    serial = [_feed(SileroVAD(), _pcm(n), PIECE) for n in names]
    results: list[list[VadEvent]] = [[] for _ in names]

    def run(i: int) -> None:
        results[i] = _feed(SileroVAD(), _pcm(names[i]), PIECE)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == serial


def test_resampler_is_exact_in_time_and_chunk_invariant() -> None:
    t = np.arange(48000) / 24000
    x = np.sin(2 * np.pi * 1000 * t).astype(np.float32)
    whole = _Resampler(24000).push(x)
    r = _Resampler(24000)
    pieces = np.concatenate([r.push(x[i : i + 1237]) for i in range(0, len(x), 1237)])
    np.testing.assert_array_equal(pieces, whole)
    expected = np.sin(2 * np.pi * 1000 * np.arange(len(whole)) / 16000)
    # Past the filter's start-up (zeros before the first sample) it is the 16 kHz sine.
    assert np.max(np.abs(whole[64:] - expected[64:])) < 1e-3
    # 11 kHz (above the 8 kHz Nyquist of the output) is filtered, not aliased.
    high = np.sin(2 * np.pi * 11000 * t).astype(np.float32)
    assert np.sqrt(np.mean(_Resampler(24000).push(high)[64:] ** 2)) < 1e-3
