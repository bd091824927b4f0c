"""Where an interaction enters a world session, through the real session runner on real
Redis (``workers/sessions/world.py``): ``reference/world`` takes a change into the chunk
under way at its next step (its spec's ``interaction_at = "step"``). The test plays the
API: it sends each interaction from inside a step of the device's loop, so the runner
reads it at the next step boundary, exactly where the test says. A tiny Helios
(``SupportsStepRestart``) also takes one sent during a chunk's last step: the step stops
at its next block gate and runs again with it (sent from inside a transformer block)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from models.catalog import FAMILY_SPECS
from models.registry import BUILTIN_MODELS
from models.session_bus import ChunkOutput, InteractionCommand, StopCommand, WorldSessionConfig
from tests.helpers import world_session_config
from tests.integration.test_third_party_adapters import Api
from tests.unit.helios_fixtures import SEQ_LEN, SESSION_START, tiny_helios_pipeline
from workers.media.fmp4 import FragmentedMP4Writer
from workers.pipelines.base import WorldConfig
from workers.pipelines.blocks import denoiser_blocks
from workers.pipelines.diffusers.helios.adapter import HeliosWorldAdapter
from workers.pipelines.diffusers.helios.session import HeliosState
from workers.pipelines.reference_world import ReferenceWorldPipeline, WorldState
from workers.pipelines.registry import PipelineRegistry
from workers.sessions import world as world_module
from workers.sessions.turns import SessionStop
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


# --- a chunk's last step run again for an interaction (Helios, ``SupportsStepRestart``) ---

HELIOS = "Helios/tiny"
HELIOS_STEPS = 2  # per chunk
HELIOS_CHUNKS = 3


class _Device:
    """The runner over a tiny Helios adapter (CPU) whose transformer blocks can send
    commands as the API would: ``sends[(chunk, step, block)]`` goes out before that
    block of that step (``step`` counted from 0, ``block`` as the gate counts), once,
    and the block waits until the session's follower has seen it. Counts the steps run
    per chunk, restarted ones included."""

    def __init__(
        self,
        api: Api,
        monkeypatch: pytest.MonkeyPatch,
        sends: dict[tuple[int, int, int], list[BaseModel]],
        **options: Any,
    ) -> None:
        self.api, self.sends, self.follower = api, sends, None
        self.adapter = HeliosWorldAdapter(
            pipe=tiny_helios_pipeline(), max_sequence_length=SEQ_LEN, **options
        )
        self.adapter.load("cpu")
        self.steps: dict[int, int] = {}
        self.at = (0, 0)  # (chunk, step) of the step in flight
        step = self.adapter.step

        def counted(state: HeliosState) -> None:
            self.at = (state.chunk_index, state.step_index)
            self.steps[state.chunk_index] = self.steps.get(state.chunk_index, 0) + 1
            step(state)

        monkeypatch.setattr(self.adapter, "step", counted)
        for block in denoiser_blocks(self.adapter._loaded()):
            block.register_forward_pre_hook(self._before_block)  # after the gate's
        monkeypatch.setattr(api.registry, "world", lambda name: self.adapter)
        device = self

        class Followed(SessionStop):
            def __init__(self, bus: Any, key: str) -> None:
                super().__init__(bus, key)
                device.follower = self

        monkeypatch.setattr(world_module, "SessionStop", Followed)

    def _before_block(self, module: Any, args: Any) -> None:
        for command in self.sends.pop((*self.at, self.adapter.gate.blocks), []):
            entry = self.api.bus.publish(self.api.inbox, command)
            follower = self.follower
            assert follower is not None
            deadline = time.monotonic() + 10
            while not (follower.is_set() or follower.interaction_after(_before(entry))):
                assert time.monotonic() < deadline, "the follower never saw the command"
                time.sleep(0.002)

    def run(self, config: WorldSessionConfig) -> list[tuple[ChunkOutput, bytes]]:
        runner = WorldSessionRunner(self.api.settings, self.api.registry, self.api.bus, "w")
        out = self.api.run_to_end(lambda: runner.run(self.api.id, config))
        media = [(e.event, e.data) for e in out if isinstance(e.event, ChunkOutput)]
        return [(chunk, data or b"") for chunk, data in media if chunk.kind == "media"]


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id`` (Redis ids are ``ms-seq``)."""
    ms, seq = (int(part) for part in entry_id.split("-"))
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-{2**63 - 1}"


def _helios_config() -> WorldSessionConfig:
    start = {k: v for k, v in SESSION_START.items() if k != "type"}
    start |= {"num_frames": 33 * HELIOS_CHUNKS, "extra_params": {"max_chunks_ahead": 0}}
    return world_session_config(**start)


def _helios_in_process(read_at: dict[tuple[int, int], InteractionCommand]) -> list[bytes]:
    """The same session in this process, ``read_at[(chunk, step)]`` given to ``interact``
    just before that step; encoded as the worker does."""
    adapter = HeliosWorldAdapter(pipe=tiny_helios_pipeline(), max_sequence_length=SEQ_LEN)
    adapter.load("cpu")
    config = _helios_config()
    state = adapter.start(
        WorldConfig(
            prompt=config.prompt, width=config.width, height=config.height,
            num_frames=config.num_frames, fps=config.fps, seed=config.seed,
            steps_per_chunk=HELIOS_STEPS, extra=dict(config.extra_params),
        )
    )  # fmt: skip
    writer = FragmentedMP4Writer(config.width, config.height, config.fps)
    out = []
    for k in range(HELIOS_CHUNKS):
        for i in range(HELIOS_STEPS):
            command = read_at.get((k, i))
            if command is not None:
                assert command.transition_chunks is not None
                adapter.interact(
                    state, command.prompt, None, command.transition_chunks, command.event_id
                )
            adapter.step(state)
        out.append(writer.write_chunk(adapter.take_chunk(state)))
    return out


def _restarts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "runs again" in r.getMessage()]


LAST = HELIOS_STEPS - 1
LATE = InteractionCommand(event_id="late", prompt="a blue cube", transition_chunks=0)


def test_an_interaction_during_a_chunk_s_last_step_restarts_it_and_enters_that_chunk(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent before block 2 (of the CFG pair's 4) of chunk 1's last step, a prompt change
    stops that step at block 3 and is read; the step runs again with it, so chunk 1 is
    where it starts, and every chunk's bytes are the in-process session's with the change
    read just before that step (and chunk 1's differ from the unsteered session's)."""
    caplog.set_level(logging.INFO, logger=world_module.__name__)
    device = _Device(Api(redis_url), monkeypatch, {(1, LAST, 2): [LATE]})
    media = device.run(_helios_config())
    assert device.api.outcome == "completed"
    assert [c.started_event_ids for c, _ in media] == [[], ["late"], []]
    assert device.steps == {0: HELIOS_STEPS, 1: HELIOS_STEPS + 1, 2: HELIOS_STEPS}
    (restart,) = _restarts(caplog)
    assert device.api.id in restart and "interaction late arrived before block 3" in restart
    expected = _helios_in_process({(1, LAST): LATE})
    assert [data for _, data in media] == expected
    assert media[1][1] != _helios_in_process({})[1]


def test_an_interaction_during_an_earlier_step_enters_at_the_next_step(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Sent during chunk 1's first step (not its last), the change restarts nothing: the
    step runs out, and the change conditions the chunk's next step, as before."""
    caplog.set_level(logging.INFO, logger=world_module.__name__)
    device = _Device(Api(redis_url), monkeypatch, {(1, 0, 2): [LATE]})
    media = device.run(_helios_config())
    assert [c.started_event_ids for c, _ in media] == [[], ["late"], []]
    assert device.steps == dict.fromkeys(range(HELIOS_CHUNKS), HELIOS_STEPS)
    assert _restarts(caplog) == []
    assert [data for _, data in media] == _helios_in_process({(1, 1): LATE})


def test_a_stop_with_an_interaction_during_the_last_step_stops(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop sent with an interaction during chunk 1's last step stops the session
    there (a stop keeps priority over a restart): chunk 0 only, nothing run again."""
    caplog.set_level(logging.INFO, logger=world_module.__name__)
    stop = StopCommand(reason="client")
    device = _Device(Api(redis_url), monkeypatch, {(1, LAST, 2): [LATE, stop]})
    media = device.run(_helios_config())
    assert device.api.outcome == "stopped"
    assert len(media) == 1 and _restarts(caplog) == []


def test_with_interaction_at_chunk_the_last_step_is_not_restarted(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Helios served with ``interaction_at = "chunk"``: the change sent during chunk
    1's last step waits for chunk 2, and no step runs again."""
    caplog.set_level(logging.INFO, logger=world_module.__name__)
    spec = FAMILY_SPECS["diffusers.helios"].model_copy(update={"interaction_at": "chunk"})
    device = _Device(Api(redis_url), monkeypatch, {(1, LAST, 2): [LATE]}, spec=spec)
    media = device.run(_helios_config())
    assert [c.started_event_ids for c, _ in media] == [[], [], ["late"]]
    assert device.steps == dict.fromkeys(range(HELIOS_CHUNKS), HELIOS_STEPS)
    assert _restarts(caplog) == []
