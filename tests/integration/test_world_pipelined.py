"""A world session's chunks are sent beside the device's work (``workers/sessions/world.py``
with its delivery lane), on real Redis, through the real session runner: while chunk 0 is
held on its way out (a ``session_chunk:0`` failpoint that sleeps), the device makes the
next chunks, and the client still gets every chunk once, in order, with its events; a
stop ends the session without a chunk after ``finished``, and with no gap."""

from __future__ import annotations

import gc
import json
import time
import weakref
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from models.session_bus import FinishedOutput, InteractionCommand
from tests.helpers import world_session_config
from tests.integration.test_third_party_adapters import WORLD, Api
from workers.pipelines.base import checkpoint
from workers.sessions.world import WorldSessionRunner

pytestmark = pytest.mark.integration

HOLD_S = 1.0  # how long chunk 0 is held on the lane


def _record_steps(api: Api, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, float]]:
    """(chunk, wall-clock time) of every step the device runs."""
    pipe = api.registry.world(WORLD.name)
    steps: list[tuple[int, float]] = []
    step = pipe.step

    def recorded(state: Any) -> None:
        steps.append((state.chunk, time.time()))
        step(state)

    monkeypatch.setattr(pipe, "step", recorded)
    return steps


class Lane(NamedTuple):
    api: Api
    runner: WorldSessionRunner
    steps: list[tuple[int, float]]  # (chunk, wall-clock time) of every step the device runs


@pytest.fixture
def lane(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lane:
    """A session's API side and its runner, whose chunk 0 is held ``HOLD_S`` on its way
    out (the ``session_chunk:0`` failpoint), with the steps the device runs."""
    api = Api(redis_url)
    path = tmp_path / "failpoints.json"
    path.write_text(json.dumps({"session_chunk:0": f"sleep:{HOLD_S}"}))
    api.settings.worker.failpoints_file = str(path)
    runner = WorldSessionRunner(api.settings, api.registry, api.bus, "test-worker")
    return Lane(api, runner, _record_steps(api, monkeypatch))


def test_the_device_makes_the_next_chunks_while_one_is_sent(lane: Lane) -> None:
    api, runner, steps = lane
    config = world_session_config(model=WORLD.name, prompt="red", num_frames=12)
    api.send(InteractionCommand(event_id="evt_1", prompt="blue", transition_chunks=2))
    out = api.run_to_end(lambda: runner.run(api.id, config))
    assert api.outcome == "completed"
    chunks = [e for e in out if e.event.type == "chunk"]
    assert [c.event.generation_chunk_index for c in chunks] == [0, 1, 2]
    assert [c.event.started_event_ids for c in chunks] == [["evt_1"], [], []]
    assert [c.event.completed_event_ids for c in chunks] == [[], ["evt_1"], []]
    assert out[-1].event == FinishedOutput(stopped=False, artifact_id=None)
    # chunk 1 was under way on the device while chunk 0 was held on its way out
    sent_0 = chunks[0].event.produced_at
    assert sent_0 is not None
    assert any(chunk == 1 and t < sent_0 for chunk, t in steps)


def test_a_stop_while_chunks_wait_to_be_sent_ends_the_session_cleanly(lane: Lane) -> None:
    api, runner, steps = lane
    config = world_session_config(model=WORLD.name, prompt="red", num_frames=400)
    try:
        thread = api.run(lambda: runner.run(api.id, config))
        # once chunk 0 is made, and held on the lane
        out = api.stop_when(thread, lambda: any(chunk >= 1 for chunk, _ in steps))
        assert api.outcome == "stopped"
    finally:
        api.close()
    assert out[-1].event == FinishedOutput(stopped=True, artifact_id=None)
    indices = [e.event.generation_chunk_index for e in out if e.event.type == "chunk"]
    assert indices == list(range(len(indices)))  # in order, no gap, none repeated
    assert len(indices) < 100  # the stop ended it long before its 100 chunks


def _holding_steps(api: Api, monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[torch.Tensor]]:
    """Each step of the paint world holds a tensor of its own and checks for a stop
    inside the step (``checkpoint()``), where a stop raises through its frames; the
    weak references of those tensors."""
    pipe = api.registry.world(WORLD.name)
    held: list[weakref.ref[torch.Tensor]] = []
    step = pipe.step

    def holding(state: Any) -> None:
        activations = torch.ones(64, 64)
        held.append(weakref.ref(activations))
        step(state)
        time.sleep(0.01)
        checkpoint()  # raises SessionStopped once the session is told to stop

    monkeypatch.setattr(pipe, "step", holding)
    return held


def test_a_session_stopped_inside_a_step_keeps_none_of_its_tensors(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop that lands inside a step leaves nothing of that step referenced once the
    runner returns: no collection by the caller needed (the step's frames are cleared,
    as a job's are), so a stopped session's device memory is free when it says stopped."""
    api = Api(redis_url)
    runner = WorldSessionRunner(api.settings, api.registry, api.bus, "test-worker")
    held = _holding_steps(api, monkeypatch)
    config = world_session_config(model=WORLD.name, prompt="red", num_frames=400)
    was_enabled = gc.isenabled()
    gc.disable()  # only reference counting may free the step's tensors
    try:
        thread = api.run(lambda: runner.run(api.id, config))
        api.stop_when(thread, lambda: len(held) >= 5)
        assert api.outcome == "stopped"
        assert [ref for ref in held if ref() is not None] == []
    finally:
        if was_enabled:
            gc.enable()
        api.close()
