"""Cancel points inside ``prepare`` and ``decode``: a long call of an adapter stops at the
next ``checkpoint()`` once the executor's check raises, and the pipeline is unharmed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.unit.reference_fixtures import loaded, video_request
from tests.unit.test_diffusers_video import CASES, FAMILIES, _adapter, _request, _run
from workers.pipelines.base import checkpoint, checkpoints, step_stops
from workers.pipelines.reference_video import ReferenceVideoPipeline


class Stop(Exception):
    pass


class Counter:
    """A check that counts its calls and raises from call ``stop_at`` on."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls = 0
        self.stop_at = stop_at

    def __call__(self) -> None:
        self.calls += 1
        if self.stop_at is not None and self.calls >= self.stop_at:
            raise Stop


def test_checkpoint_is_a_no_op_outside_a_job_and_scoped_inside() -> None:
    checkpoint()  # no context: nothing happens
    counter = Counter()
    with checkpoints(counter):
        checkpoint()
        checkpoint()
    checkpoint()
    assert counter.calls == 2


def test_reference_video_prepare_and_decode_stop_midway() -> None:
    pipe = loaded(ReferenceVideoPipeline)
    request = video_request(width=320, height=192, num_frames=48, num_inference_steps=2)
    counting = Counter()
    with checkpoints(counting):
        state = pipe.prepare(request)
    assert counting.calls >= 3  # several cancel points in one prepare (48 frames, 3 chunks)
    with checkpoints(Counter(stop_at=2)), pytest.raises(Stop):
        pipe.prepare(request)
    while not state.done:
        pipe.step(state)
    expected = pipe.decode(state).frames
    counting = Counter()
    with checkpoints(counting):
        pipe.decode(state)
    assert counting.calls >= 3
    with checkpoints(Counter(stop_at=2)), pytest.raises(Stop):
        pipe.decode(state)
    np.testing.assert_array_equal(pipe.decode(state).frames, expected)  # unharmed


@pytest.mark.parametrize("name", FAMILIES)
def test_diffusers_text_encoder_and_vae_blocks_are_cancel_points(name: str) -> None:
    case = CASES[name]
    adapter = _adapter(case, case.build())
    req = _request(case)
    expected, _ = _run(adapter, req)
    counting = Counter()
    with checkpoints(counting):
        state: Any = adapter.prepare(req)
    assert counting.calls >= 2  # text-encoder blocks
    with checkpoints(Counter(stop_at=1)), pytest.raises(Stop):
        adapter.prepare(req)
    while not state.done:
        adapter.step(state)
    counting = Counter()
    with checkpoints(counting):
        adapter.decode(state)
    assert counting.calls >= 2  # VAE blocks
    with checkpoints(Counter(stop_at=2)), pytest.raises(Stop):
        adapter.decode(state)
    # an interrupted decode leaves nothing behind: the next job is bit-identical
    again, _ = _run(adapter, req)
    np.testing.assert_array_equal(again, expected)


class BlockStop:
    """A step's stop question that answers ``Stop`` from block ``stop_at`` on, and
    records the block numbers it was asked about."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.asked: list[int] = []
        self.stop_at = stop_at

    def __call__(self, block: int) -> BaseException | None:
        self.asked.append(block)
        return Stop() if self.stop_at is not None and block >= self.stop_at else None


@pytest.mark.parametrize("name", FAMILIES)
def test_diffusers_denoiser_blocks_stop_a_step_midway(name: str) -> None:
    """Every family's denoiser blocks ask the step's stop question; a stop raised at block
    2 (the first, where the tiny model has one) ends the step there (the step does not
    count), and the job run again afterwards is bit-identical: an interrupted step leaves
    nothing on the shared pipeline."""
    case = CASES[name]
    adapter = _adapter(case, case.build())
    req = _request(case)
    expected, _ = _run(adapter, req)
    state: Any = adapter.prepare(req)
    asked = BlockStop()
    with step_stops(asked):
        adapter.step(state)
    per_step = len(asked.asked)  # blocks x passes (two under Wan's sequential CFG)
    assert per_step >= 1 and asked.asked == list(range(1, per_step + 1))
    assert state.step_index == 1
    stop_at = min(2, per_step)
    stopper = BlockStop(stop_at=stop_at)
    with step_stops(stopper), pytest.raises(Stop):
        adapter.step(state)
    assert stopper.asked == list(range(1, stop_at + 1)) and state.step_index == 1
    adapter.step(state)  # outside a job step the gates do nothing
    again, _ = _run(adapter, req)
    np.testing.assert_array_equal(again, expected)


def test_a_compiled_module_is_one_graph_and_a_cancel_point_at_each_call() -> None:
    """A module compiled beside the blocks (a VAE decoder) keeps no cancel point inside:
    dynamo cannot trace the hook, which broke the graph at every block (H3's VAE decode
    ran half as fast). Its call is the cancel point instead, and still raises."""
    import torch

    from workers.pipelines.diffusers.shared.compiled import BlockCompiler, graphs_made
    from workers.pipelines.diffusers.shared.loading import install_checkpoints

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = torch.tanh(block(x))
            return x

    torch.manual_seed(0)
    decoder = Decoder()
    x = torch.randn(2, 8)
    expected = decoder(x)
    install_checkpoints(type("Pipe", (), {"components": {"vae": decoder}})())
    counting = Counter()
    with checkpoints(counting):
        decoder(x)
    assert counting.calls == 4  # one per block, eager

    BlockCompiler(backend="eager").compile_module(decoder, "decoder")
    torch._dynamo.reset()
    before = graphs_made()
    counting = Counter()
    with checkpoints(counting):
        torch.testing.assert_close(decoder(x), expected)
    assert graphs_made() - before == 1  # no break at the blocks
    assert counting.calls == 1  # the call itself
    with checkpoints(Counter(stop_at=1)), pytest.raises(Stop):
        decoder(x)
