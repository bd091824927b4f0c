"""Where an interaction enters a world session, through the real session runner on real
Redis (``workers/sessions/world.py``): ``reference/world`` takes a change into the chunk
under way at its next step (its spec's ``interaction_at = "step"``). The test plays the
API: it sends each interaction from inside a step of the device's loop, so the runner
reads it at the next step boundary, exactly where the test says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from models.registry import BUILTIN_MODELS
from models.session_bus import ChunkOutput, InteractionCommand
from tests.helpers import world_session_config
from tests.integration.test_third_party_adapters import Api
from workers.media.fmp4 import FragmentedMP4Writer
from workers.pipelines.base import WorldConfig
from workers.pipelines.reference_world import ReferenceWorldPipeline, WorldState
from workers.pipelines.registry import PipelineRegistry
from workers.sessions.world import WorldSessionRunner

pytestmark = pytest.mark.integration

MODEL = "reference/world"
STEPS = 3  # per chunk
CHUNKS = 4  # 45 frames: 9, then 12 a chunk
# (chunk, steps of it run) → the interaction sent then: while chunk 1 has two steps left,
# and once chunk 2's last step has run (made, being decoded: none left to take it).
SENT = {
    (1, 1): InteractionCommand(event_id="mid", camera="d", transition_chunks=1),
    (2, STEPS): InteractionCommand(event_id="late", prompt="p at night", transition_chunks=0),
}


def _sending_in_steps(api: Api, pipe: ReferenceWorldPipeline) -> Callable[[WorldState], None]:
    """``pipe.step`` that sends the interaction of ``SENT`` due after the step it ran."""
    step = pipe.step

    def sending(state: WorldState) -> None:
        step(state)
        command = SENT.get((state.chunk_index, state.step_index))
        if command is not None:
            api.send(command)

    return sending


def _in_process(width: int, height: int, fps: float) -> list[bytes]:
    """The same session in this process, each interaction given to ``interact`` where the
    runner reads it: after the step it was sent in, or, sent after a chunk's last step,
    once that chunk is taken (the device decodes it in the same turn); encoded as the
    worker does."""
    pipe = ReferenceWorldPipeline()
    pipe.load("cpu")
    config = WorldConfig(
        prompt="p", width=width, height=height, num_frames=45, fps=fps, seed=1,
        steps_per_chunk=STEPS,
    )  # fmt: skip
    state = pipe.start(config)
    writer = FragmentedMP4Writer(width, height, fps)

    def read(command: InteractionCommand | None) -> None:
        if command is not None:
            assert command.transition_chunks is not None
            pipe.interact(
                state, command.prompt, command.camera, command.transition_chunks, command.event_id
            )

    out = []
    for k in range(CHUNKS):
        for i in range(1, STEPS + 1):
            pipe.step(state)
            if i < STEPS:
                read(SENT.get((k, i)))
        out.append(writer.write_chunk(pipe.take_chunk(state)))
        read(SENT.get((k, STEPS)))
    return out


def test_an_interaction_enters_the_chunk_under_way_while_a_step_of_it_is_left(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent while chunk 1 has steps left, a camera change is started (and, a cut of one
    chunk, completed) in chunk 1; sent after chunk 2's last step, a prompt change waits
    for chunk 3. Every chunk's bytes are those of the same calls made in one process."""
    api = Api(redis_url)
    api.registry = PipelineRegistry({MODEL: BUILTIN_MODELS[MODEL]}, "cpu")
    pipe = api.registry.world(MODEL)
    assert isinstance(pipe, ReferenceWorldPipeline) and pipe.spec.interaction_at == "step"
    monkeypatch.setattr(pipe, "step", _sending_in_steps(api, pipe))
    runner = WorldSessionRunner(api.settings, api.registry, api.bus, "test-worker")
    config = world_session_config(
        num_frames=45, num_inference_steps=STEPS, extra_params={"max_chunks_ahead": 0}
    )
    out = api.run_to_end(lambda: runner.run(api.id, config))
    assert api.outcome == "completed"
    media = [(e.event, e.data) for e in out if isinstance(e.event, ChunkOutput)]
    media = [(chunk, data) for chunk, data in media if chunk.kind == "media"]
    events: list[Any] = [
        (c.started_event_ids, c.active_event_ids, c.completed_event_ids) for c, _ in media
    ]
    assert events == [
        ([], [], []),
        (["mid"], ["mid"], ["mid"]),
        ([], [], []),
        (["late"], ["late"], ["late"]),
    ]
    expected = _in_process(config.width, config.height, config.fps)
    assert [data for _, data in media] == expected
