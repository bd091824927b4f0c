"""VoiceSessionRunner against a real Redis (the module's own database, ``redis_db``): the
worker side of ``WS /v1/realtime``.

The runner runs in a thread, exactly as on a realtime worker slot; the test plays the API
by writing commands to ``oq:session:{id}:in`` and reading ``…:out``, with the models of
``models/session_bus.py`` the API uses (no hand-typed copy of a message). Assertions are about
order and state; the deadlines below only stop a broken runner from hanging the suite.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from pydantic import BaseModel

from models.registry import BUILTIN_MODELS, ServedModel
from models.session_bus import (
    OUTPUTS,
    AcceptedOutput,
    CancelCommand,
    FailedOutput,
    FinishedOutput,
    KeepaliveCommand,
    RespondCommand,
    SessionOutput,
    StopCommand,
    VoiceSessionConfig,
    VoiceTurnSpec,
)
from storage.bus import BusMessage, EventBus
from storage.constants import session_abandoned_key, session_in_key, session_out_key
from storage.settings import RealtimeSettings, Settings
from tests.integration.conftest import REDIS_BASE_URL, flushed_redis
from workers.pipelines.reference_voice import ReferenceVoicePipeline
from workers.pipelines.registry import PipelineRegistry
from workers.sessions.voice import VoiceSessionRunner

pytestmark = pytest.mark.integration

HANG_GUARD_S = 30.0
RATE = 24000
Out = BusMessage[SessionOutput]


class BrokenVoice(ReferenceVoicePipeline):
    """reference/voice whose third step fails (``module:Class`` adapters get options)."""

    def __init__(self, **_: Any) -> None:
        super().__init__()

    def step(self, state: Any) -> Any:
        if state.pos >= 2 * self.step_samples:
            raise RuntimeError("secret detail that must not reach the client")
        return super().step(state)


class NumpyBrokenVoice(BrokenVoice):
    """reference/voice whose third step hits a numpy ``ValueError`` (not the client's fault)."""

    def step(self, state: Any) -> Any:
        if state.pos >= 2 * self.step_samples:
            np.zeros(3).reshape(2, 2)
        return super().step(state)


class SlowVoice(ReferenceVoicePipeline):
    """reference/voice whose steps take 60 ms (longer than the 40 ms of audio they make),
    counting the steps it ran."""

    steps = 0

    def __init__(self, **_: Any) -> None:
        super().__init__()

    def step(self, state: Any) -> Any:
        time.sleep(0.06)
        type(self).steps += 1
        return super().step(state)


@pytest.fixture
def client(redis_db: int) -> Iterator[redis.Redis]:
    with flushed_redis(f"{REDIS_BASE_URL}/{redis_db}") as r:
        yield r


class Session:
    """One session under test: the runner thread plus the API's ends of the streams."""

    def __init__(self, client: redis.Redis, **realtime: Any) -> None:
        settings = Settings(
            realtime=RealtimeSettings(
                **{"keepalive_s": 0.2, "lost_after_s": 5.0, "audio_lead_ms": 100, **realtime}
            )
        )
        broken = ServedModel(
            name="test/broken-voice",
            adapter=f"{__name__}:BrokenVoice",
            spec=BUILTIN_MODELS["reference/voice"].spec.model_copy(
                update={"name": "test/broken-voice"}
            ),
        )
        numpy_broken = ServedModel(
            name="test/numpy-broken-voice",
            adapter=f"{__name__}:NumpyBrokenVoice",
            spec=BUILTIN_MODELS["reference/voice"].spec.model_copy(
                update={"name": "test/numpy-broken-voice"}
            ),
        )
        slow = ServedModel(
            name="test/slow-voice",
            adapter=f"{__name__}:SlowVoice",
            spec=BUILTIN_MODELS["reference/voice"].spec.model_copy(
                update={"name": "test/slow-voice"}
            ),
        )
        models = {
            "reference/voice": BUILTIN_MODELS["reference/voice"],
            broken.name: broken,
            numpy_broken.name: numpy_broken,
            slow.name: slow,
        }
        self.bus = EventBus(client, ttl_s=120)
        self.runner = VoiceSessionRunner(
            settings, PipelineRegistry(models, "cpu"), self.bus, "test-worker"
        )
        self.id = "sess_" + secrets.token_hex(6)
        self.inbox, self.outbox = session_in_key(self.id), session_out_key(self.id)
        self.after = "0-0"
        self.outcome: str | None = None
        self.thread: threading.Thread | None = None

    def start(self, model: str = "reference/voice", sample_rate: int = RATE) -> None:
        self.send(KeepaliveCommand())  # the API creates the in stream first
        config = VoiceSessionConfig(model=model, owner="local", sample_rate=sample_rate)

        def run() -> None:
            self.outcome = self.runner.run(self.id, config)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def send(self, command: BaseModel, data: bytes | None = None) -> str:
        return self.bus.publish(self.inbox, command, data)

    def respond(self, response_id: str, pcm: bytes = b"", text: str | None = None) -> str:
        turn = VoiceTurnSpec(text=text, voice="alloy", speed=1.0)
        return self.send(RespondCommand(response_id=response_id, turn=turn), pcm or None)

    def cancel(self, response_id: str, reason: str = "client_cancelled") -> str:
        return self.send(CancelCommand(response_id=response_id, reason=reason))

    def outputs(self, after: str = "0-0") -> list[Out]:
        return self.bus.read_as(OUTPUTS, self.outbox, after, block_ms=200)

    def read_until(self, done: Any) -> list[Out]:
        """Outputs (keep-alives dropped) up to and including the first ``done(entry)``."""
        got: list[Out] = []
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            for entry in self.outputs(self.after):
                self.after = entry.id
                if entry.event.type == "keepalive":
                    continue
                got.append(entry)
                if done(entry):
                    return got
        raise AssertionError(f"no matching output; got {[e.event for e in got]}")

    def stop(self) -> list[Out]:
        """Stop the session; its outputs up to ``finished``."""
        self.send(StopCommand())
        return self.read_until(lambda e: e.event.type == "finished")

    def join(self) -> str | None:
        assert self.thread is not None
        self.thread.join(HANG_GUARD_S)
        assert not self.thread.is_alive()
        return self.outcome


def _finished(response_id: str):
    return lambda e: e.event.type == "response_finished" and e.event.response_id == response_id


def _audio(entries: list[Out], response_id: str) -> list[Out]:
    return [e for e in entries if e.event.type == "audio" and e.event.response_id == response_id]


def test_respond_streams_audio_then_completes(client: redis.Redis) -> None:
    s = Session(client)
    s.start()
    turn = b"\x00\x00" * int(RATE * 1.4)
    s.respond("resp_1", turn)
    out = s.read_until(_finished("resp_1"))
    assert out[0].event == AcceptedOutput(worker_id="test-worker", lease_s=3.0)
    audio = _audio(out, "resp_1")
    assert out[1:-1] == audio  # nothing else in between
    step_bytes = RATE * 40 // 1000 * 2  # each output: whole 40 ms steps (a chunk of them)
    assert all(len(e.data or b"") % step_bytes == 0 and e.data for e in audio)
    assert all(isinstance(e.event.produced_at, float) for e in audio)
    done = out[-1].event
    assert done.status == "completed"
    total = sum(len(e.data or b"") for e in audio)
    assert done.audio_ms == total // 2 * 1000 // RATE
    # Same answer as the pipeline gives on its own (0.6 + 0.5 x 1.4 s = 1.3 s).
    assert done.audio_ms == 1320
    assert done.transcript == "I heard you speak for 1.4 seconds."
    assert "".join(e.event.text or "" for e in audio) == done.transcript
    # A second turn on the same session, text only.
    s.respond("resp_2", text="one two three")
    out = s.read_until(_finished("resp_2"))
    assert out[-1].event.status == "completed"
    assert out[-1].event.transcript == "You wrote 3 words."
    assert s.stop()[-1].event == FinishedOutput()
    assert s.join() == "stopped"


def test_cancel_ends_the_response_within_one_chunk(client: redis.Redis) -> None:
    s = Session(client, audio_lead_ms=300)
    s.start()
    s.respond("resp_long", b"\x00\x00" * RATE * 8)  # a 4.6 s answer
    first = s.read_until(lambda e: e.event.type == "audio")
    s.cancel("resp_unknown")
    cancel_id = s.cancel("resp_long", "turn_detected")
    out = first + s.read_until(_finished("resp_long"))
    done = out[-1].event
    assert done.status == "cancelled"
    audio = _audio(out, "resp_long")
    assert done.audio_ms == sum(len(e.data or b"") for e in audio) // 2 * 1000 // RATE
    assert 0 < done.audio_ms < 4600
    # Redis stamps both streams' ids from its own clock: at most the one chunk (one
    # output, audio_chunk_ms: 3 steps of 40 ms) that was being computed when the cancel
    # arrived was published after it.
    cancel_ms = int(cancel_id.split("-")[0])
    assert sum(int(e.id.split("-")[0]) > cancel_ms for e in audio) <= 1
    assert done.transcript == "".join(e.event.text or "" for e in audio)
    # The unknown id was ignored; a cancel after the end is ignored too; the session goes on.
    assert not any(e.event.type == "response_finished" and e is not out[-1] for e in out)
    s.cancel("resp_long")
    s.respond("resp_next")
    nxt = s.read_until(_finished("resp_next"))
    assert [e.event.type for e in nxt if e.event.type != "audio"] == ["response_finished"]
    assert nxt[-1].event.status == "completed"
    s.stop()
    assert s.join() == "stopped"


def test_respond_while_busy_waits_its_turn_and_can_be_cancelled(client: redis.Redis) -> None:
    s = Session(client)
    s.start()
    s.respond("resp_a")
    s.respond("resp_b")
    s.respond("resp_c")
    s.cancel("resp_b")
    out = s.read_until(_finished("resp_c"))
    finished = [
        (e.event.response_id, e.event.status) for e in out if e.event.type == "response_finished"
    ]
    assert finished == [("resp_b", "cancelled"), ("resp_a", "completed"), ("resp_c", "completed")]
    assert _audio(out, "resp_b") == []
    last_a = max(i for i, e in enumerate(out) if getattr(e.event, "response_id", None) == "resp_a")
    first_c = min(i for i, e in enumerate(out) if getattr(e.event, "response_id", None) == "resp_c")
    assert last_a < first_c  # one response at a time
    s.stop()
    assert s.join() == "stopped"


def test_stop_mid_response_cancels_it_and_finishes(client: redis.Redis) -> None:
    s = Session(client)
    s.start()
    s.respond("resp_1", b"\x00\x00" * RATE * 8)
    s.read_until(lambda e: e.event.type == "audio")
    out = s.stop()
    assert [e.event.type for e in out if e.event.type != "audio"] == [
        "response_finished",
        "finished",
    ]
    assert out[-2].event.status == "cancelled"
    assert s.join() == "stopped"


def test_api_silence_ends_the_session(client: redis.Redis) -> None:
    s = Session(client, lost_after_s=0.5, keepalive_s=0.1)
    s.start()
    got: list[Out] = []
    deadline = time.monotonic() + HANG_GUARD_S
    while not any(e.event.type == "finished" for e in got) and time.monotonic() < deadline:
        got += s.outputs(got[-1].id if got else "0-0")
    types = [e.event.type for e in got]
    assert types[0] == "accepted"
    assert "keepalive" in types  # the worker kept talking while the API was silent
    assert types[-1] == "finished"
    assert s.join() == "stopped"


def test_abandoned_session_is_not_started(client: redis.Redis) -> None:
    s = Session(client)
    client.set(session_abandoned_key(s.id), "1", ex=60)
    config = VoiceSessionConfig(model="reference/voice", owner="local")
    assert s.runner.run(s.id, config) == "abandoned"
    assert s.bus.read(s.outbox) == []


def test_wrong_sample_rate_fails_the_session(client: redis.Redis) -> None:
    s = Session(client)
    s.start(sample_rate=16000)
    out = s.read_until(lambda e: e.event.type == "failed")
    assert out[-1].event == FailedOutput(
        code="invalid_request", message="sample_rate 16000 is not 24000"
    )
    assert s.join() == "invalid_request"


@pytest.mark.parametrize("model", ["test/broken-voice", "test/numpy-broken-voice"])
def test_model_failure_fails_the_response_and_the_session(client: redis.Redis, model: str) -> None:
    """An unexpected error (a RuntimeError, or a ValueError of numpy) is an internal error
    with a fixed message: its text stays in the worker's log."""
    s = Session(client)
    s.start(model=model)
    s.respond("resp_1", b"\x00\x00" * RATE)
    out = s.read_until(lambda e: e.event.type == "failed")
    # it broke after two steps (80 ms), inside the 200 ms prebuffer: nothing was sent
    assert [e.event.type for e in out] == ["accepted", "response_finished", "failed"]
    assert out[-2].event.status == "failed"
    assert out[-2].event.audio_ms == 0
    assert out[-1].event == FailedOutput(code="internal_error", message="internal error")
    assert s.join() == "internal_error"


def test_a_slow_model_sees_a_cancel_while_filling_the_prebuffer(client: redis.Redis) -> None:
    """The 200 ms prebuffer takes a slow model five 60 ms steps; a cancel sent once the
    first step ran ends the response after the step in progress, and none of its audio
    is sent."""
    s = Session(client, audio_prebuffer_ms=200, audio_lead_ms=300)
    s.start(model="test/slow-voice")
    s.read_until(lambda e: e.event.type == "accepted")
    SlowVoice.steps = 0
    s.respond("resp_1", b"\x00\x00" * RATE)
    deadline = time.monotonic() + HANG_GUARD_S
    while SlowVoice.steps == 0 and time.monotonic() < deadline:  # the prebuffer is filling
        time.sleep(0.005)
    s.cancel("resp_1")
    out = s.read_until(_finished("resp_1"))
    assert _audio(out, "resp_1") == []
    assert out[-1].event.status == "cancelled" and out[-1].event.audio_ms == 0
    assert 1 <= SlowVoice.steps < 5  # stopped before the prebuffer was full
    s.send(StopCommand())
    assert s.join() == "stopped"
