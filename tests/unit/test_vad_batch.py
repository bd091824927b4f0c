"""The process-wide VAD scorer: appends of many sessions scored in one batch give each
session exactly the events its own detector would have given it, in order."""

from __future__ import annotations

import asyncio
import json
import wave
from pathlib import Path

import numpy as np
import pytest

from api.realtime.vad_batch import VadScorer
from realtime.vad import CONTEXT, FRAME, Net, SileroVAD, VadEvent, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "speech"
NAMES = [f["file"] for f in json.loads((FIXTURES / "fixtures.json").read_text())["fixtures"]]
PIECE = 4800  # 100 ms of 24 kHz PCM16


def _pcm(name: str) -> bytes:
    with wave.open(str(FIXTURES / name)) as w:
        return w.readframes(w.getnframes())


def _alone(pcm: bytes) -> list[VadEvent]:
    vad, events = SileroVAD(), []
    for i in range(0, len(pcm), PIECE):
        events += vad.feed(pcm[i : i + PIECE])
    return events


async def _session(scorer: VadScorer, pcm: bytes, piece: int) -> list[VadEvent]:
    vad, events = SileroVAD(), []
    for i in range(0, len(pcm), piece):
        events += await scorer.feed(vad, pcm[i : i + piece])
    return events


@pytest.mark.parametrize("gather_ms", [0.0, 5.0])
def test_batched_sessions_get_the_events_of_their_own_detector(gather_ms: float) -> None:
    clips = [_pcm(name) for name in NAMES] * 2  # twelve-odd sessions at once
    expected = [_alone(pcm) for pcm in clips]
    assert any(expected)  # the fixtures hold speech

    async def main() -> list[list[VadEvent]]:
        scorer = VadScorer(load_model(), gather_ms)
        # different append sizes: batches mix appends of 0, 1, 2… frames
        return list(
            await asyncio.gather(
                *(_session(scorer, pcm, PIECE + 96 * (i % 3)) for i, pcm in enumerate(clips))
            )
        )

    # appends of another size cut the same frames: the events match a 100 ms feed
    assert asyncio.run(main()) == expected


def test_rows_of_a_batch_equal_one_row_calls() -> None:
    net = load_model()
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, CONTEXT + FRAME)) * 0.1).astype(np.float32)
    state = (rng.standard_normal((2, 5, 128)) * 0.1).astype(np.float32)
    probs, out = net.batch(x, state)
    for i in range(5):
        p, s = net(x[i : i + 1], np.ascontiguousarray(state[:, i : i + 1]))
        assert p == probs[i]
        assert np.array_equal(s[:, 0], out[:, i])


class _Broken(Net):
    def __call__(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        raise RuntimeError("the network is broken")


def test_a_failing_network_fails_the_appends_of_its_batch_and_the_scorer_goes_on() -> None:
    async def main() -> None:
        broken = VadScorer(_Broken())
        with pytest.raises(RuntimeError, match="broken"):
            await broken.feed(SileroVAD(net=_Broken()), b"\x00\x00" * 2400)
        assert await broken.feed(SileroVAD(net=_Broken()), b"\x00\x00" * 10) == []  # no frame

    asyncio.run(main())
