"""LongCat-AudioDiT's streamed decode: the audio VAE decoded window by window
(``longcat_audio/decode.py``), each window's PCM published before the next one decodes.

Windows with the default context (the decoder's reach rounded up, plus one frame) give
the whole decode to rounding: bit-equal on this CPU with the tiny model; within
``WINDOW_BOUND`` of the peak with the released model's strides (measured: 2.6e-7 of the
peak, 6.9e-7 absolute; a previous measurement with 12 frames of context: about 1e-6),
while 4 frames of context are 0.3 % of the peak off. Pure unit: the job run is a
recorder, no bus.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import LongCatAudioDiTVae

from models.events import ChunkEvent
from models.job_specs import AudioSpec
from tests.unit.longcat_fixtures import tiny_longcat_pipeline
from workers.jobs.output import make_output
from workers.media.pcm_stream import PcmStream, SupportsAudioDecodeStream
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.longcat_audio.adapter import LongCatAudioAdapter
from workers.pipelines.diffusers.longcat_audio.decode import (
    context_frames,
    decode_windows,
    decodes_whole_frames,
    reach_frames,
    windows,
)
from workers.pipelines.diffusers.longcat_audio.random_weights import TINY_CONFIG, VAE

# Windowed against whole, relative to the clip's peak.
WINDOW_BOUND = 1e-6
TEXT = "The trains run on time today, and on other days too."  # 107 frames: 4 windows


def _request(**kw: Any) -> GenerationRequest:
    base: dict[str, Any] = dict(
        prompt=TEXT, duration_s=5.0, num_inference_steps=2, seed=3, guidance_scale=4.0
    )
    return GenerationRequest.audio(**(base | kw))


@pytest.fixture(scope="module")
def longcat() -> LongCatAudioAdapter:
    adapter = LongCatAudioAdapter(pipe=tiny_longcat_pipeline())
    adapter.load("cpu")
    return adapter


def _stepped(adapter: LongCatAudioAdapter) -> Any:
    state = adapter.prepare(_request())
    while not state.done:
        adapter.step(state)
    adapter.end()
    return state


class _Run:
    """What make_output asks of a JobRun, recorded (a pure unit: no database, no bus)."""

    def __init__(self, spec: AudioSpec, on_publish: Any = None) -> None:
        self.spec = spec
        self.job = SimpleNamespace(id="job", model=spec.model)
        worker = SimpleNamespace(preview_every=0, log_frame_digests=False)
        self.settings = SimpleNamespace(worker=worker)
        self.events: list[tuple[ChunkEvent, bytes]] = []
        self.stages: list[str] = []
        self.blocks = self.step = 0
        self.in_step = False
        self._on_publish = on_publish

    def publish(self, event: ChunkEvent, data: bytes | None = None) -> str | None:
        assert data is not None
        self.events.append((event, data))
        if self._on_publish is not None:
            self._on_publish()
        return None

    def failpoint(self, name: str) -> None: ...
    def enter(self, stage: str) -> None:
        self.stages.append(stage)

    def report(self, progress: int, *, force: bool = False) -> None: ...
    def stop_point(self) -> Any:
        return lambda: None

    def in_step_stop(self) -> Any:
        return lambda block: None

    def stream_pcm(self, audio: Any) -> None:
        raise AssertionError("a windowed decode streams as it decodes, not after")


def _spec(**kw: Any) -> AudioSpec:
    base: dict[str, Any] = {
        "model": "longcat",
        "prompt": TEXT,
        "duration_ms": 5000,
        "seed": 3,
        "num_inference_steps": 2,
        "response_format": "pcm",
        "stream_pcm": True,
    }
    return AudioSpec.model_validate(base | kw)


def test_the_windows_cover_the_clip_in_order() -> None:
    assert list(windows(107, 16, 128)) == [(0, 16), (16, 48), (48, 107)]
    assert list(windows(300, 16, 64)) == [
        (0, 16), (16, 48), (48, 112), (112, 176), (176, 240), (240, 300)
    ]  # fmt: skip
    assert list(windows(5, 16, 128)) == [(0, 5)]


def test_windows_are_the_whole_decode(longcat: LongCatAudioAdapter) -> None:
    assert isinstance(longcat, SupportsAudioDecodeStream)
    state = _stepped(longcat)
    whole = longcat.decode_audio(state)[0].numpy()
    stream = longcat.decode_audio_stream(state)
    assert stream is not None
    pieces = list(stream)
    assert len(pieces) == 3 and all(rate == 8000 for _, rate in pieces)
    assert [p.shape[1] for p, _ in pieces] == [16 * 256, 32 * 256, (107 - 48) * 256]
    joined = np.concatenate([p for p, _ in pieces], axis=1)
    assert joined.shape == whole.shape and joined.dtype == np.float32
    assert np.abs(joined - whole).max() <= WINDOW_BOUND * np.abs(whole).max()


def test_the_released_strides_need_their_reach() -> None:
    """The released VAE's strides (channels cut to 4: the reach is the strides' and
    kernels'): 13 frames of context, and windows within the bound of the whole decode;
    4 frames are not enough."""
    torch.manual_seed(0)
    vae = LongCatAudioDiTVae(**{**VAE, "channels": 4}).eval()
    with torch.no_grad():
        for param in vae.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    assert decodes_whole_frames(vae)
    assert 11 < reach_frames(vae.decoder) < 12 and context_frames(vae.decoder) == 13
    latents = torch.randn(1, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = vae.decode(latents.permute(0, 2, 1)).sample
        peak = whole.abs().max().item()

        def error(context: int) -> float:
            parts = decode_windows(vae, latents, first=8, largest=32, context=context)
            return (torch.cat(list(parts), dim=-1) - whole).abs().max().item()

        assert error(13) <= WINDOW_BOUND * peak
        assert error(4) > 1e-3 * peak


def test_a_vae_whose_frames_do_not_cut_decodes_whole() -> None:
    odd = LongCatAudioDiTVae(**{**VAE, **TINY_CONFIG["vae"], "strides": [15, 16]})
    assert not decodes_whole_frames(odd)
    adapter = LongCatAudioAdapter(pipe=tiny_longcat_pipeline())
    adapter.load("cpu")
    state = _stepped(adapter)
    adapter.pipe.vae = odd
    assert adapter.decode_audio_stream(state) is None
    off = LongCatAudioAdapter(pipe=adapter.pipe, decode_window=0)
    assert off.decode_audio_stream(state) is None


def test_each_window_goes_out_before_the_next_decodes(longcat: LongCatAudioAdapter) -> None:
    """``PcmStream.decode``: the chunks of a window are published before the next window
    is decoded, in order; the streamed PCM is the clip the executor encodes."""
    state = _stepped(longcat)
    decodes: list[int] = []  # windows decoded when each chunk went out
    calls = [0]
    vae = longcat.pipe.vae
    real = vae.decode
    run = _Run(_spec(), on_publish=lambda: decodes.append(calls[0]))

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    vae.decode = counted
    try:
        stream = PcmStream(run, run.spec)
        pieces = longcat.decode_audio_stream(state)
        assert pieces is not None
        media = stream.decode(pieces)
    finally:
        del vae.decode
    assert calls[0] == 3 and decodes[0] == 1  # the first chunk: one window decoded
    assert sorted(decodes) == decodes and set(decodes) == {1, 2, 3}
    clip = stream.finish(media.audio, 8000)  # type: ignore[arg-type]
    events = [e for e, _ in run.events]
    assert [e.seq for e in events] == list(range(len(events)))
    streamed = np.frombuffer(b"".join(d for _, d in run.events), "<i2")
    assert np.array_equal(streamed, np.round(clip.samples[0] * 32767.0).astype(np.int16))


def test_the_job_streams_its_decode(longcat: LongCatAudioAdapter, tmp_path: Path) -> None:
    """``make_output`` of a PCM-streaming job: the chunks of the first window out before
    the decode ends, the file holding what was streamed; without streaming, the whole
    decode."""
    pipe = longcat.pipe
    marks: list[tuple[str, int]] = []
    real = pipe.vae.decode

    def counted(*args: Any, **kwargs: Any) -> Any:
        marks.append(("decode", len(run.events)))
        return real(*args, **kwargs)

    run = _Run(_spec())
    pipe.vae.decode = counted
    try:
        files, extra, _ = make_output(longcat, run, _request(), tmp_path, 0)  # type: ignore[arg-type]
    finally:
        del pipe.vae.decode
    assert [m for m, _ in marks] == ["decode"] * 3
    assert marks[-1][1] > 0  # chunks were out before the last window decoded
    assert run.stages == ["denoise", "decode", "encode"]
    streamed = b"".join(d for _, d in run.events)
    ((variant, path, _),) = files
    assert variant == "audio" and path.read_bytes() == streamed
    assert extra["output"]["num_samples"] * 2 == len(streamed)

    whole_dir = tmp_path / "whole"
    whole_dir.mkdir()
    plain = _Run(_spec(stream_pcm=False, response_format="wav"))
    files, _, _ = make_output(longcat, plain, _request(), whole_dir, 0)  # type: ignore[arg-type]
    assert not plain.events and files[0][1].suffix == ".wav"
