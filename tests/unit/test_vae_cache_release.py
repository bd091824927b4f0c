"""A decode stopped at a cancel point leaves nothing on the shared VAE (issue 43 §3).

Wan's VAE (``AutoencoderKLWan``, which Helios decodes with too) keeps the last frames of
every causal convolution's input in ``_feat_map`` while it decodes and clears it only when
a decode returns. A world session stopped inside a chunk's decode (``checkpoint()``: its
``SessionStopped``), or a job cancelled there, left that cache filled on the worker's one
VAE until the next decode: at Helios-Distilled's 640x384 in bf16, 0.5 to 1.1 GiB (a
meta-device decode: 540 MiB after the first latent frame, 1,108 MiB after the second),
the size of the +953 MiB the H100's world stack kept after its sessions, whose last ones
are closed at a random moment of their second chunk (its decode is a third of it).

Each test holds weak references to the cache's tensors as the stop is raised and finds
none alive once the exception's frames are cleared, as the runner and the executor clear
them (``forget_frames``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests.unit.diffusers_fixtures import tiny_wan_pipeline
from tests.unit.helios_fixtures import (
    SEQ_LEN,
    first_chunk_stepped,
    tiny_helios_pyramid_pipeline,
)
from tests.unit.test_run_ahead import FakeDevice
from workers.common.memory import forget_frames
from workers.pipelines import run_ahead
from workers.pipelines.base import GenerationRequest, checkpoints
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.shared.common import decode_video
from workers.pipelines.diffusers.shared.loading import install_checkpoints
from workers.pipelines.run_ahead import CHECKPOINT_LOOKAHEAD, RunAhead


class Stopped(Exception):
    """The stop a session's or a job's checkpoint raises."""


class StopInDecode:
    """A ``checkpoint()`` check that raises at its ``at``-th call, weak references to the
    VAE's cached tensors taken then (the cache is full of the decode under way)."""

    def __init__(self, vae: Any, at: int) -> None:
        self.vae, self.at, self.calls = vae, at, 0
        self.held: list[weakref.ref[torch.Tensor]] = []

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == self.at:
            cached = [t for t in self.vae._feat_map if isinstance(t, torch.Tensor)]
            self.held = [weakref.ref(t) for t in cached]
            raise Stopped(f"stopped at checkpoint {self.at}")


def alive(held: list[weakref.ref[torch.Tensor]]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in held)


def test_a_world_chunk_stopped_in_its_decode_leaves_no_cache() -> None:
    adapter = HeliosWorldAdapter(
        pipe=tiny_helios_pyramid_pipeline(distilled=True), max_sequence_length=SEQ_LEN
    )
    adapter.load("cpu")
    frames = adapter.take_chunk(first_chunk_stepped(adapter, seed=1, steps_per_chunk=3))

    state = first_chunk_stepped(adapter, seed=1, steps_per_chunk=3)
    stop = StopInDecode(adapter._loaded().vae, at=12)  # the second latent frame's decode
    with pytest.raises(Stopped) as raised, checkpoints(stop):
        adapter.take_chunk(state)
    assert stop.held, "the stop came before the decode had cached anything"
    forget_frames(raised.value)
    del raised, state
    assert alive(stop.held) == 0
    # the VAE decodes the next chunk of another session as if nothing had happened
    again = first_chunk_stepped(adapter, seed=1, steps_per_chunk=3)
    assert torch.equal(torch.as_tensor(adapter.take_chunk(again)), torch.as_tensor(frames))


def _job_decode() -> tuple[Any, Callable[[], np.ndarray]]:
    """A tiny Wan pipeline with the worker's cancel points, and a job's decode of the
    same latents each call."""
    pipe: Any = tiny_wan_pipeline()
    install_checkpoints(pipe)
    request = GenerationRequest.video(
        prompt="a red ball", width=32, height=32, num_frames=9, fps=16.0,
        num_inference_steps=2, seed=1,
    )  # fmt: skip
    latents = torch.randn(1, 16, 3, 4, 4)

    @torch.no_grad()
    def decode() -> np.ndarray:
        return decode_video(pipe, request, latents)

    return pipe, decode


def test_a_job_decode_stopped_midway_leaves_no_cache() -> None:
    pipe, decode = _job_decode()
    stop = StopInDecode(pipe.vae, at=8)
    with pytest.raises(Stopped) as raised, checkpoints(stop):
        decode()
    assert stop.held
    forget_frames(raised.value)
    del raised
    assert alive(stop.held) == 0


def test_a_stop_seen_while_the_decode_waits_for_the_device_ends_it_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA each VAE block's cancel point first holds the host ``lookahead`` blocks
    ahead of the device (``workers/pipelines/run_ahead.py``), asking the stop question
    while it waits. Played here on the CPU with a fake device (every block taken as
    queued on a device that runs one block per two polls of the host): a paced decode is
    the same decode; a stop that arrives while the host waits ends it in that wait,
    before another block is queued, and leaves no cache on the VAE."""
    pipe, decode = _job_decode()
    expected = decode()  # outside a stop's context: unpaced

    device = FakeDevice(ticks=2)
    ahead: list[int] = []

    class Recorded(RunAhead):
        def pace(self, poll: Any = None, stream: Any = None) -> None:
            super().pace(poll, stream)
            ahead.append(device.ahead)

    monkeypatch.setattr(run_ahead, "_stream_of", lambda args: "the device's stream")
    pacer = Recorded(CHECKPOINT_LOOKAHEAD, device.event, device.sleep)
    monkeypatch.setattr(run_ahead._THREAD, "pacer", pacer, raising=False)
    with checkpoints(lambda: None):
        paced = decode()
    np.testing.assert_array_equal(paced, expected)
    assert len(ahead) == len(device.recorded) > 8  # every VAE block was paced
    assert max(ahead) == CHECKPOINT_LOOKAHEAD  # and went on no further ahead

    # the client closes 12 polls into the next decode, while the host waits
    marks = len(device.recorded)
    closed_at: list[int] = []  # the marks recorded then

    def close() -> None:
        if device.slept == 12:
            closed_at.append(len(device.recorded))

    device.slept, device.on_tick = 0, close
    held: list[weakref.ref[torch.Tensor]] = []

    def check() -> None:
        if closed_at:
            cached = [t for t in pipe.vae._feat_map if isinstance(t, torch.Tensor)]
            held.extend(weakref.ref(t) for t in cached)
            raise Stopped("stopped while the host waited for the device")

    with pytest.raises(Stopped) as raised, checkpoints(check):
        decode()
    assert closed_at and held, "the stop came before the decode had cached anything"
    assert marks < len(device.recorded) == closed_at[0] < 2 * marks  # no block after it
    forget_frames(raised.value)
    del raised
    assert alive(held) == 0
    again = decode()
    np.testing.assert_array_equal(again, expected)
