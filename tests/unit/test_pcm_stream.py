"""``PcmStream``: pieces of a clip published as chunk events while the steps make them;
the file the executor encodes holds exactly the streamed samples."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from models.events import ChunkEvent
from models.job_specs import AudioSpec
from workers.media.audio import prepare_audio
from workers.media.pcm_stream import PcmStream


class _Run:
    """Records what a JobRun would publish (pure unit: no bus)."""

    def __init__(self) -> None:
        self.events: list[tuple[ChunkEvent, bytes]] = []

    def publish(self, event: ChunkEvent, data: bytes | None = None) -> str | None:
        assert data is not None
        self.events.append((event, data))
        return None


def _spec(**kw: Any) -> AudioSpec:
    base: dict[str, Any] = {
        "model": "reference/speech",
        "prompt": "hi",
        "duration_ms": 1000,
        "seed": 0,
        "num_inference_steps": 1,
        "response_format": "pcm",
        "sample_rate": 24_000,
        "channels": 1,
        "stream_pcm": True,
    }
    return AudioSpec.model_validate(base | kw)


def _pieces(rate: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = (int(0.73 * rate), int(0.05 * rate), 0, int(1.31 * rate))
    return [0.3 * rng.standard_normal((1, n)).astype(np.float32) for n in lengths]


@pytest.mark.parametrize(
    ("rate_in", "rate_out", "channels"),
    [(22_050, 24_000, 1), (24_000, 24_000, 2), (22_050, 16_000, 2)],
)
def test_streamed_chunks_are_the_clip(rate_in: int, rate_out: int, channels: int) -> None:
    run = _Run()
    stream = PcmStream(run, _spec(sample_rate=rate_out, channels=channels))
    assert not stream.started
    stream.feed(None)
    pieces = _pieces(rate_in)
    published_after: list[int] = []
    for piece in pieces:
        stream.feed((piece, rate_in))
        published_after.append(sum(e.num_frames for e, _ in run.events))
    assert published_after[0] > 0.6 * rate_out  # the first piece goes out at once
    whole = np.concatenate(pieces, axis=1)
    clip = stream.finish(whole, rate_in)
    n_out = round(whole.shape[1] * rate_out / rate_in)
    assert clip.sample_rate == rate_out and clip.samples.shape == (channels, n_out)
    events = [e for e, _ in run.events]
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(0 < e.num_frames <= rate_out // 10 for e in events)
    assert all(e.byte_length == len(d) == 2 * channels * e.num_frames for e, d in run.events)
    streamed = np.frombuffer(b"".join(d for _, d in run.events), "<i2").reshape(-1, channels).T
    assert streamed.shape == (channels, n_out)
    assert np.array_equal(streamed, np.round(clip.samples * 32767.0).astype(np.int16))
    # What prepare_audio makes of the whole clip, up to the resampler's rounding.
    whole_out = prepare_audio(whole, rate_in, rate=rate_out, channels=channels).samples
    assert np.sqrt(np.mean((whole_out - clip.samples) ** 2)) < 0.02


def test_decode_must_be_the_pieces() -> None:
    stream = PcmStream(_Run(), _spec())
    piece = np.zeros((1, 100), np.float32)
    stream.feed((piece, 22_050))
    with pytest.raises(RuntimeError, match="handed out"):
        stream.finish(np.zeros((1, 101), np.float32), 22_050)
    with pytest.raises(RuntimeError, match="changed rate"):
        stream.feed((piece, 24_000))
