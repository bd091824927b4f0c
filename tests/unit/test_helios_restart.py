"""A Helios chunk's last step stopped at a block gate and run again with an interaction
(``HeliosWorldAdapter.restarts_step``, ``SupportsStepRestart``): the step left the chunk
as it was before it, so the chunk is the one made with the interaction read just before
that step, bit for bit. A tiny random-weight Helios (``helios_fixtures.py``), CPU,
float32; the runner's side (the gate, on real Redis) is
``tests/integration/test_world_step_interactions.py``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from models.catalog import FAMILY_SPECS
from tests.unit.helios_fixtures import (
    SEQ_LEN,
    SIZE,
    tiny_helios_pipeline,
    tiny_helios_pyramid_pipeline,
)
from workers.pipelines.base import SupportsStepRestart, WorldConfig, step_stops
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.helios.session import HeliosState
from workers.sessions.turns import StepRestart

CHUNK = 33  # pixel frames per chunk
Asked = list[tuple[int, int, int, bool]]  # (chunk, step, block, restarts_step) per gate


def _adapter(pipe: Any, **options: Any) -> HeliosWorldAdapter:
    """An adapter over a pipe of its own (the first adapter over a pipe hooks its blocks
    with its gate, whose block count the others' steps would not reset)."""
    built = HeliosWorldAdapter(pipe=pipe, dtype="float32", max_sequence_length=SEQ_LEN, **options)
    built.load("cpu")
    return built


def _config(chunks: int, steps: int, **extra: Any) -> WorldConfig:
    return WorldConfig(
        prompt="a red ball", width=SIZE, height=SIZE, num_frames=chunks * CHUNK, fps=24.0,
        seed=3, steps_per_chunk=steps, extra=extra,
    )  # fmt: skip


def _take(adapter: HeliosWorldAdapter, state: HeliosState, out: list[Any]) -> None:
    out.append((adapter.take_chunk(state), adapter.events_for_chunk(state)))


def _read_before_last_step(
    adapter: HeliosWorldAdapter, config: WorldConfig, chunk: int, transition: int
) -> list[Any]:
    """The step-entry path: the interaction read just before ``chunk``'s last step."""
    state = adapter.start(config)
    out: list[Any] = []
    for k in range(adapter.num_chunks(state)):
        while not adapter.chunk_done(state):
            if k == chunk and state.step_index == state.steps_per_chunk - 1:
                adapter.interact(state, "a blue cube", None, transition, "e1")
            adapter.step(state)
        _take(adapter, state, out)
    return out


def _restarted(
    adapter: HeliosWorldAdapter, config: WorldConfig, chunk: int, block: int, transition: int
) -> tuple[list[Any], Asked]:
    """The runner's path: the interaction arrives before block ``block`` of ``chunk``'s
    last step, whose gate stops it there where ``restarts_step`` says so; read then, and
    the step run again. Also every gate's question and the adapter's answer."""
    state = adapter.start(config)
    out: list[Any] = []
    asked: Asked = []
    arrived: list[int] = []  # the chunk whose last step was stopped, once

    def gate(b: int) -> BaseException | None:
        last = adapter.restarts_step(state)
        asked.append((state.chunk_index, state.step_index, b, last))
        if state.chunk_index == chunk and b == block and last and not arrived:
            return StepRestart(f"interaction e1 arrived before block {b}")
        return None

    for _ in range(adapter.num_chunks(state)):
        while not adapter.chunk_done(state):
            try:
                with step_stops(gate):
                    adapter.step(state)
            except StepRestart:
                arrived.append(state.chunk_index)
                assert state.step_index == state.steps_per_chunk - 1  # not counted
                adapter.interact(state, "a blue cube", None, transition, "e1")
        _take(adapter, state, out)
    assert arrived == [chunk]
    return out, asked


@pytest.mark.parametrize(
    ("pyramid", "steps", "chunk", "block", "transition"),
    [(None, 2, 1, 3, 2), (None, 1, 1, 1, 0), ([1, 1, 1], 3, 0, 2, 0)],
    ids=["base-in-the-uncond-pass", "base-a-chunk-s-only-step", "distilled-stage-3"],
)
def test_a_last_step_stopped_for_an_interaction_runs_again_with_it(
    pyramid: list[int] | None,
    steps: int,
    chunk: int,
    block: int,
    transition: int,
) -> None:
    """Stopped inside the transformer (Helios-Base: in the CFG pair's second pass, 4
    blocks a step; or a chunk's only step, just begun; Helios-Distilled: at stage 3's
    step, after its upsampling and renoising drew from the RNG, before DMD's step) and
    run again after ``interact``, the last step makes every chunk bit for bit as the
    interaction read just before it does: started in that chunk, which differs from the
    unsteered session's. Only the chunk's last step is one to restart."""
    pipe: Any = tiny_helios_pipeline()
    extra: dict[str, Any] = {}
    if pyramid is not None:
        pipe = tiny_helios_pyramid_pipeline(distilled=True)
        extra = {"guidance_scale": 1.0, "pyramid_num_inference_steps_list": pyramid}
    adapter = _adapter(pipe)
    assert isinstance(adapter, SupportsStepRestart)
    config = _config(2 if pyramid else 3, steps, **extra)
    got, asked = _restarted(adapter, config, chunk, block, transition)
    expected = _read_before_last_step(adapter, config, chunk, transition)
    for (mine, mine_events), (theirs, their_events) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
        assert mine_events == their_events
    assert got[chunk][1][0] == ["e1"]
    plain = adapter.start(config)
    unsteered = []
    for _ in range(adapter.num_chunks(plain)):
        while not adapter.chunk_done(plain):
            adapter.step(plain)
        unsteered.append(adapter.take_chunk(plain))
    assert not np.array_equal(got[chunk][0], unsteered[chunk])
    for k in range(chunk):
        np.testing.assert_array_equal(got[k][0], unsteered[k])
    assert {(s, last) for _, s, _, last in asked} == {(s, s == steps - 1) for s in range(steps)}
    restarted = [a for a in asked if a[:3] == (chunk, steps - 1, block)]
    assert len(restarted) == 2  # stopped there once, then run again whole


def test_with_interaction_at_chunk_no_step_restarts() -> None:
    """A Helios served with ``interaction_at = "chunk"`` takes an interaction at a chunk
    boundary only, so none of its steps is one to run again."""
    spec = FAMILY_SPECS["diffusers.helios"].model_copy(update={"interaction_at": "chunk"})
    adapter = _adapter(tiny_helios_pipeline(), spec=spec)
    state = adapter.start(_config(2, 2))
    answers = []
    while not adapter.chunk_done(state):
        answers.append(adapter.restarts_step(state))
        adapter.step(state)
    assert answers == [False, False]
