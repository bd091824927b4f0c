"""The contract between the API and a worker, per message type, over a real Redis.

Every ``SessionCommand`` goes out through the API's relay (``api.realtime.relay.Relay``) and
is read back by the worker's slot helper (``workers.sessions.slot.SessionSlot``); every
``SessionOutput`` goes the other way, published by the slot and delivered by the relay
to its session. Every task payload goes through ``storage.queue.JobQueue`` onto the real
Celery broker and is handed to the runner by the worker's ``run_task``. Each side parses
into the same model it was sent as, and binary data stays raw bytes. The example lists
must name every member of the unions, so a new message type cannot skip this test.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest
import redis
import redis.asyncio
from pydantic import BaseModel, ValidationError

from api.model_availability import ModelAvailability
from api.realtime.relay import Relay
from models.session_bus import (
    AcceptedOutput,
    CancelCommand,
    ChunkOutput,
    FailedOutput,
    FinishedOutput,
    InteractionCommand,
    JobTask,
    KeepaliveCommand,
    KeepaliveOutput,
    ReferenceImageCommand,
    RespondCommand,
    ResponseAudioOutput,
    ResponseFinishedOutput,
    SessionCommand,
    SessionConfig,
    SessionOutput,
    SessionTask,
    StartedOutput,
    StopCommand,
    TaskPayload,
    VoiceSessionConfig,
    VoiceTurnSpec,
)
from storage.bus import AsyncEventBus, BusMessage, EventBus
from storage.constants import job_queue, realtime_queue
from storage.queue import JobQueue, make_celery
from storage.settings import RealtimeSettings, RedisSettings, Settings
from storage.worker_presence import WorkerPresence
from tests.helpers import world_session_config
from workers.runtime.celery_app import run_task
from workers.sessions.slot import SessionSlot

pytestmark = pytest.mark.integration

PCM = bytes(range(256)) * 8  # not valid UTF-8, not base64: raw bytes must survive as they are
COMMANDS: list[tuple[BaseModel, bytes | None]] = [
    (KeepaliveCommand(), None),
    (RespondCommand(response_id="resp_1", turn=VoiceTurnSpec(text="hé", speed=1.25)), PCM),
    (RespondCommand(response_id="resp_2", turn=VoiceTurnSpec()), None),
    (CancelCommand(response_id="resp_1", reason="turn_detected"), None),
    (InteractionCommand(event_id="evt_1", prompt="dusk", camera="wd", transition_chunks=2), None),
    (ReferenceImageCommand(), b"\x89PNG\r\n\x1a\n" + PCM),
    (StopCommand(reason="client"), None),
]
OUTPUTS: list[tuple[BaseModel, bytes | None]] = [
    (AcceptedOutput(worker_id="host:1:worker", attempt=2, lease_s=3.0), None),
    (KeepaliveOutput(), None),
    (StartedOutput(), None),
    (
        ChunkOutput(
            kind="media",
            produced_at=1764460000.25,
            generation_chunk_index=0,
            num_frames=9,
            started_event_ids=["evt_1"],
            active_event_ids=["evt_1"],
        ),
        b"\x00\x00\x00\x18ftyp" + PCM,
    ),
    (ChunkOutput(kind="trailer", produced_at=1764460001.5), b"\x00\x00\x00\x08mfra"),
    (ResponseAudioOutput(response_id="resp_1", produced_at=1764460000.5, text="I "), PCM),
    (ResponseFinishedOutput(response_id="resp_1", status="cancelled", audio_ms=40), None),
    (FailedOutput(code="internal_error", message="internal error"), None),
    (FinishedOutput(stopped=True, artifact_id="video_abc"), None),
]
CONFIGS: list[Any] = [
    VoiceSessionConfig(model="reference/voice", owner="key_1", sample_rate=24000),
    world_session_config(
        owner="key_1",
        prompt="a lighthouse",
        seed=7,
        extra_params={"flow_shift": 5.0, "persist": True, "camera_action_script": [[["w"]]]},
    ),
]


def _members(union: Any) -> set[type]:
    return set(get_args(get_args(union)[0]))


def test_the_examples_cover_every_message_type() -> None:
    assert {type(m) for m, _ in COMMANDS} == _members(SessionCommand)
    assert {type(m) for m, _ in OUTPUTS} == _members(SessionOutput)
    assert {type(c) for c in CONFIGS} == _members(SessionConfig)
    assert _members(TaskPayload) == {JobTask, SessionTask}  # both sent below


@pytest.fixture
def session(redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    client = redis.Redis.from_url(redis_url)
    session_id = "sess_" + secrets.token_hex(6)
    try:
        yield session_id, client
    finally:
        client.delete(f"oq:session:{session_id}:in", f"oq:session:{session_id}:out")
        client.close()


class _Collector:
    """A session as the relay sees it, keeping what the relay delivers."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.got: list[BusMessage[SessionOutput]] = []
        self.reads: list[int] = []  # entries per read that delivered any

    def ended(self) -> bool:
        return len(self.got) >= self.expected

    async def outputs(self, entries: list[BusMessage[SessionOutput]], now: float) -> None:
        if entries:
            self.reads.append(len(entries))
        self.got += entries

    async def worker_gone(self, code: str, message: str) -> None:
        raise AssertionError(f"worker gone: {code}")

    async def broker_lost(self) -> None:
        raise AssertionError("broker lost")

    async def keepalive_due(self) -> bool:
        return True

    async def relay_ended(self) -> None:
        pass


@dataclass
class _Host:
    """The API process as a session sees it (``api.state.AppState`` in the API)."""

    settings: Settings
    abus: AsyncEventBus
    queue: JobQueue
    availability: ModelAvailability
    voice_sessions: dict[str, Any] = field(default_factory=dict)


def _relay(session_id: str, redis_url: str, target: Any) -> tuple[Relay, Any]:
    client = redis.asyncio.Redis.from_url(redis_url)
    settings = Settings(redis=RedisSettings(url=redis_url))
    served = ModelAvailability(WorkerPresence(redis.Redis.from_url(redis_url)), [])
    host = _Host(settings, AsyncEventBus(client, ttl_s=60), JobQueue(make_celery(settings)), served)
    return Relay(session_id, host, target), client


def _deliver(
    session_id: str, redis_url: str, target: _Collector, send: Callable[[], None] | None = None
) -> None:
    """Relay the session's outputs to ``target`` until it has them all; ``send``: called
    (on a thread) once the relay is waiting on the stream."""

    async def relay() -> None:
        relay, aclient = _relay(session_id, redis_url, target)
        relay.start()
        if send is not None:
            await asyncio.sleep(0.1)  # the relay blocks on the empty stream
            await asyncio.to_thread(send)
        async with asyncio.timeout(10):
            while not target.ended():
                await asyncio.sleep(0.01)
        await relay.close()
        await aclient.aclose()

    asyncio.run(relay())


def test_every_command_reaches_the_worker_as_sent(
    session: tuple[str, redis.Redis], redis_url: str
) -> None:
    session_id, client = session

    async def send() -> None:
        relay, aclient = _relay(session_id, redis_url, _Collector(0))
        for command, data in COMMANDS:
            await relay.command(command, data)
        await aclient.aclose()

    asyncio.run(send())
    slot = SessionSlot(EventBus(client, ttl_s=60), session_id, RealtimeSettings())
    heard = slot.heard
    got = slot.commands()
    assert [(m.event, m.data) for m in got] == COMMANDS
    assert all(type(m.event) is type(c) for m, (c, _) in zip(got, COMMANDS, strict=True))
    assert slot.after == got[-1].id and slot.heard > heard  # the API was heard
    assert slot.commands() == []  # consumed in order, nothing twice


def test_every_output_reaches_the_session_as_sent(
    session: tuple[str, redis.Redis], redis_url: str
) -> None:
    session_id, client = session
    slot = SessionSlot(EventBus(client, ttl_s=60), session_id, RealtimeSettings())
    for output, data in OUTPUTS[:2]:
        slot.send(output, data)
    slot.send_many(OUTPUTS[2:])  # several outputs in one round trip
    target = _Collector(len(OUTPUTS))
    _deliver(session_id, redis_url, target)
    assert [(m.event, m.data) for m in target.got] == OUTPUTS
    assert all(type(m.event) is type(o) for m, (o, _) in zip(target.got, OUTPUTS, strict=True))


def test_a_burst_reaches_a_relay_that_already_waits_in_one_read(
    session: tuple[str, redis.Redis], redis_url: str
) -> None:
    """Outputs sent in one round trip (``send_many``): the relay is blocked in ``XREAD``
    when they land, and gets all of them at once, not the first entry alone (a voice
    answer's prebuffer once reached the client split that way)."""
    session_id, client = session
    slot = SessionSlot(EventBus(client, ttl_s=60), session_id, RealtimeSettings())
    burst = [(ResponseAudioOutput(response_id="resp_1", produced_at=1.0), PCM)] * 5
    target = _Collector(len(burst))
    _deliver(session_id, redis_url, target, send=lambda: slot.send_many(burst))
    assert target.reads == [5]


class _Runner:
    """One of the worker context's runners, recording what ``run_task`` hands it."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name, self.calls = name, calls

    def run(self, *args: Any) -> str:
        self.calls.append((self.name, *args))
        return self.name


class _Context:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.executor = _Runner("job", self.calls)
        self.world_sessions = _Runner("world", self.calls)
        self.voice_sessions = _Runner("voice", self.calls)


def _take(app: Any, queue: str) -> Any:
    """The first argument of the next task message on ``queue``, as the broker holds it."""
    with app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue)
        try:
            message = simple.get(timeout=10)
            args, _kwargs, _embed = message.decode()
            message.ack()
        finally:
            simple.close()
    assert json.loads(json.dumps(args)) == args  # JSON through and through
    [payload] = args
    return payload


def test_every_task_payload_reaches_its_runner_as_sent(redis_url: str) -> None:
    app = make_celery(Settings(redis=RedisSettings(url=redis_url)))
    queue = JobQueue(app)
    context: Any = _Context()
    try:
        model = "contract/" + secrets.token_hex(4)
        queue.enqueue("video_123", model)
        assert run_task(context, _take(app, job_queue(model))) == "job"
        assert context.calls[-1] == ("job", "video_123", model)  # fair share needs the model
        for example, runner in zip(CONFIGS, ("voice", "world"), strict=True):
            # a queue of its own: a live worker of the shared stack takes none of these
            config = example.model_copy(update={"model": model})
            session_id = "sess_" + secrets.token_hex(6)
            queue.start_session(session_id, config, expires_s=60)
            assert run_task(context, _take(app, realtime_queue(config.model))) == runner
            placement = (1,) if runner == "world" else ()  # a world session's attempt
            assert context.calls[-1] == (runner, session_id, config, *placement)
            assert type(context.calls[-1][2]) is type(config)
        # a world session placed again, to be taken over from its checkpoint
        queue.start_session(session_id, config, expires_s=60, attempt=2)
        assert run_task(context, _take(app, realtime_queue(config.model))) == "world"
        assert context.calls[-1] == ("world", session_id, config, 2)
        # no other job message ever shipped: a bare id or one without its model is refused
        for untyped in ("video_old", {"kind": "job", "job_id": "video_old"}):
            with pytest.raises(ValidationError):
                run_task(context, untyped)
        assert context.calls[-1] == ("world", session_id, config, 2)
    finally:
        queue.close()
