"""A world model and a voice model written only against ``workers/pipelines/base.py``.

Each adapter below is what a new model's adapter file would hold: a subclass of the
interface, nothing from a reference pipeline. They are served through the registry as
``module:Class`` entries and run by the real session runners on a real Redis, the test
playing the API on the session's ``in`` / ``out`` streams.
"""

from __future__ import annotations

import io
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import pytest
import redis
from pydantic import BaseModel

from models.catalog import ModelSpec
from models.registry import ServedModel
from models.session_bus import (
    OUTPUTS,
    FinishedOutput,
    InteractionCommand,
    KeepaliveCommand,
    RespondCommand,
    ResponseFinishedOutput,
    SessionOutput,
    StopCommand,
    VoiceSessionConfig,
    VoiceTurnSpec,
)
from storage.bus import BusMessage, EventBus
from storage.constants import session_in_key, session_out_key
from storage.settings import RealtimeSettings, Settings
from tests.helpers import world_session_config
from workers.pipelines.base import (
    ActionBlock,
    ChunkEvents,
    VoiceChunk,
    VoicePipeline,
    VoiceTurn,
    WorldConfig,
    WorldPipeline,
)
from workers.pipelines.registry import PipelineRegistry
from workers.sessions.voice import VoiceSessionRunner
from workers.sessions.world import WorldSessionRunner

pytestmark = pytest.mark.integration

HANG_GUARD_S = 60.0
Out = BusMessage[SessionOutput]
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220)}


# --- a third-party world model ---------------------------------------------------------


@dataclass
class PaintState:
    config: WorldConfig
    colour: tuple[int, int, int]
    chunk: int = 0
    steps: int = 0
    pending: list[tuple[str, str | None, int]] = field(default_factory=list)
    events: list[tuple[str, int, int]] = field(default_factory=list)  # id, first, last chunk
    last: ChunkEvents = ([], [], [])


class PaintWorld(WorldPipeline[PaintState]):
    """Solid-colour chunks of 4 frames, 2 steps each; the prompt names the colour, and
    ``extra_params.level`` (if any) replaces the blue channel."""

    FRAMES, STEPS = 4, 2

    def __init__(self, **_: Any) -> None:
        self.loaded_on: str | None = None

    def load(self, device: str) -> None:
        self.loaded_on = device

    def start(self, config: WorldConfig) -> PaintState:
        if config.prompt not in COLOURS:
            raise ValueError(f"prompt must be one of {sorted(COLOURS)}")
        return PaintState(config=config, colour=COLOURS[config.prompt])

    def num_chunks(self, state: PaintState) -> int:
        return state.config.num_frames // self.FRAMES

    def chunk_done(self, state: PaintState) -> bool:
        return state.steps >= self.STEPS

    def step(self, state: PaintState) -> None:
        if state.steps == 0:  # the chunk begins: apply what was queued for it
            for event_id, prompt, transition in state.pending:
                if prompt is not None:
                    state.colour = COLOURS[prompt]
                state.events.append((event_id, state.chunk, state.chunk + max(1, transition) - 1))
            state.pending.clear()
        state.steps += 1

    def take_chunk(self, state: PaintState) -> np.ndarray:
        cfg, k = state.config, state.chunk
        r, g, b = state.colour
        b = int(cfg.extra.get("level", b))
        frames = np.empty((self.FRAMES, cfg.height, cfg.width, 3), dtype=np.uint8)
        frames[...] = (r, g, b)
        state.last = (
            [e for e, first, _ in state.events if first == k],
            [e for e, first, last in state.events if first <= k <= last],
            [e for e, _, last in state.events if last == k],
        )
        state.chunk, state.steps = k + 1, 0
        return frames

    def events_for_chunk(self, state: PaintState) -> ChunkEvents:
        return state.last

    def interact(
        self,
        state: PaintState,
        prompt: str | None,
        camera: str | ActionBlock | None,
        transition_chunks: int,
        event_id: str,
    ) -> None:
        if prompt is not None and prompt not in COLOURS:
            raise ValueError(f"unknown colour {prompt!r}")
        state.pending.append((event_id, prompt, transition_chunks))


# --- a third-party voice model ---------------------------------------------------------


@dataclass
class EchoState:
    words: list[str]
    level: int


class EchoVoice(VoicePipeline[EchoState]):
    """Says each word of the turn's text as one 40 ms step of a constant level."""

    sample_rate = 16000
    step_ms = 40

    def __init__(self, **_: Any) -> None:
        pass

    def load(self, device: str) -> None:
        pass

    def start_response(self, turn: VoiceTurn) -> EchoState:
        return EchoState(words=(turn.text or "nothing").split(), level=int(1000 * turn.speed))

    def step(self, state: EchoState) -> VoiceChunk:
        word = state.words.pop(0)
        samples = np.full(self.sample_rate * self.step_ms // 1000, state.level, dtype="<i2")
        return VoiceChunk(pcm16=samples.tobytes(), text=word + " ")

    def done(self, state: EchoState) -> bool:
        return not state.words


# --- the API's side of a session -------------------------------------------------------


def _served(name: str, cls: type, spec: ModelSpec) -> ServedModel:
    return ServedModel(name=name, adapter=f"{__name__}:{cls.__name__}", dtype="float32", spec=spec)


WORLD = _served("acme/paint", PaintWorld, ModelSpec(name="acme/paint", streaming=True))
VOICE = _served(
    "acme/echo", EchoVoice, ModelSpec(name="acme/echo", modality="audio", streaming=True)
)


class Api:
    """Plays the API on one session's streams."""

    def __init__(self, redis_url: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.bus = EventBus(self.client, ttl_s=120)
        self.id = "sess_" + secrets.token_hex(6)
        self.inbox, self.outbox = session_in_key(self.id), session_out_key(self.id)
        self.after = "0-0"
        self.settings = Settings(
            realtime=RealtimeSettings(keepalive_s=0.2, lost_after_s=10.0, audio_lead_ms=100)
        )
        self.registry = PipelineRegistry({WORLD.name: WORLD, VOICE.name: VOICE}, "cpu")

    def send(self, command: BaseModel) -> None:
        self.bus.publish(self.inbox, command)

    def run(self, target: Callable[[], str]) -> threading.Thread:
        self.send(KeepaliveCommand())  # the API creates the in stream first
        self.outcome: str | None = None

        def go() -> None:
            self.outcome = target()

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        return thread

    def read_until(self, done: Callable[[Out], bool]) -> list[Out]:
        got: list[Out] = []
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            for entry in self.bus.read_as(OUTPUTS, self.outbox, self.after, block_ms=200):
                self.after = entry.id
                if entry.event.type != "keepalive":
                    got.append(entry)
                if done(entry):
                    return got
        raise AssertionError(f"no matching output; got {[e.event for e in got]}")

    def run_to_end(self, target: Callable[[], str]) -> list[Out]:
        """A session that ends by itself: ``target`` run as :meth:`run` does, its outputs
        up to ``finished`` once its thread has returned (``outcome`` says how), the
        streams then deleted."""
        try:
            thread = self.run(target)
            out = self.read_until(lambda e: e.event.type == "finished")
            thread.join(HANG_GUARD_S)
            return out
        finally:
            self.close()

    def stop_when(self, thread: threading.Thread, ready: Callable[[], bool]) -> list[Out]:
        """A client's stop, sent once ``ready()`` holds (polled): the outputs up to
        ``finished`` once the runner's ``thread`` has returned (``outcome`` says how)."""
        deadline = time.monotonic() + HANG_GUARD_S
        while not ready():
            assert time.monotonic() < deadline, "never ready to stop"
            time.sleep(0.01)
        self.send(StopCommand(reason="client"))
        out = self.read_until(lambda e: e.event.type == "finished")
        thread.join(HANG_GUARD_S)
        return out

    def close(self) -> None:
        self.bus.delete(self.inbox, self.outbox)
        self.client.close()


def test_a_third_party_world_model_runs_through_the_session_runner(redis_url: str) -> None:
    api = Api(redis_url)
    runner = WorldSessionRunner(api.settings, api.registry, api.bus, "test-worker")
    # 12 frames: three of the paint model's 4-frame chunks.
    config = world_session_config(
        model=WORLD.name, prompt="red", num_frames=12, extra_params={"level": 90}
    )
    # Queued before the first step: takes effect from chunk 0, over two chunks.
    api.send(InteractionCommand(event_id="evt_1", prompt="blue", transition_chunks=2))
    out = api.run_to_end(lambda: runner.run(api.id, config))
    assert api.outcome == "completed"
    assert [e.event.type for e in out] == [
        "accepted",
        "started",
        "chunk",
        "chunk",
        "chunk",
        "finished",
    ]
    chunks = [e for e in out if e.event.type == "chunk"]
    assert [c.event.generation_chunk_index for c in chunks] == [0, 1, 2]
    assert [c.event.num_frames for c in chunks] == [4, 4, 4]
    assert [c.event.started_event_ids for c in chunks] == [["evt_1"], [], []]
    assert [c.event.active_event_ids for c in chunks] == [["evt_1"], ["evt_1"], []]
    assert [c.event.completed_event_ids for c in chunks] == [[], ["evt_1"], []]
    assert out[-1].event == FinishedOutput(stopped=False, artifact_id=None)
    pipe = api.registry.world(WORLD.name)  # built from the registry entry, loaded once
    assert isinstance(pipe, PaintWorld) and pipe.loaded_on == "cpu"
    # The fMP4 the runner encoded from the adapter's frames: 12 frames of the new colour
    # (blue after the interaction) with the blue channel from extra_params.level.
    with av.open(io.BytesIO(b"".join(c.data or b"" for c in chunks)), mode="r") as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 12
    mean = np.mean([f.reshape(-1, 3).mean(axis=0) for f in frames], axis=0)
    assert np.allclose(mean, (30, 30, 90), atol=6)


def test_a_third_party_voice_model_runs_through_the_voice_runner(redis_url: str) -> None:
    api = Api(redis_url)
    runner = VoiceSessionRunner(api.settings, api.registry, api.bus, "test-worker")
    config = VoiceSessionConfig(model=VOICE.name, owner="local", sample_rate=16000)
    turn = VoiceTurnSpec(text="hello there world", voice="alloy", speed=1.5)
    try:
        thread = api.run(lambda: runner.run(api.id, config))
        api.send(RespondCommand(response_id="resp_1", turn=turn))
        out = api.read_until(lambda e: e.event.type == "response_finished")
        api.send(StopCommand())
        out += api.read_until(lambda e: e.event.type == "finished")
        thread.join(HANG_GUARD_S)
        assert api.outcome == "stopped"
    finally:
        api.close()
    # the 120 ms answer is shorter than the 200 ms prebuffer: its three steps go out as one
    # audio output, with the text of each
    kinds = ["accepted", "audio", "response_finished", "finished"]
    assert [e.event.type for e in out] == kinds
    audio = [e for e in out if e.event.type == "audio"]
    assert [e.event.text for e in audio] == ["hello there world "]
    pcm = np.frombuffer(b"".join(e.data or b"" for e in audio), dtype="<i2")
    assert len(pcm) == 3 * 640 and set(pcm.tolist()) == {1500}
    assert out[-2].event == ResponseFinishedOutput(
        response_id="resp_1", status="completed", audio_ms=120, transcript="hello there world "
    )
