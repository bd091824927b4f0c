"""The ``WS /v1/realtime/video`` session state machine, driven without a socket."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import TypeAdapter

from models.realtime_video import (
    ServerEvent,
    StartLimits,
    chunks_for_frames,
    frames_for_chunks,
    frames_in_chunk,
)
from realtime.video_protocol import (
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    InteractionRequested,
    ProtocolError,
    StartRequested,
    State,
    StopRequested,
    VideoSessionOptions,
    VideoSessionProtocol,
)

INIT = b"\x00\x00\x00\x18ftypiso6" + b"\x00" * 12 + b"moov"
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ServerEvent)


def _start(**fields: Any) -> str:
    message = {
        "type": "session.start",
        "model": "reference/world",
        "prompt": "a quiet street",
        "width": 832,
        "height": 480,
        "num_frames": 33,
        "fps": 16,
        "seed": 42,
        "image_reference": {"image_url": "data:image/png;base64,Zm9v"},
        "extra_params": {"flow_shift": 5.0, "camera_action_script": [[["w"], ["w"], ["w"]]] * 3},
    }
    message.update(fields)
    return json.dumps({k: v for k, v in message.items() if v is not None})


def _texts(frames: list[str | bytes]) -> list[dict[str, Any]]:
    """Decode every text frame, checking it against the server event schemas."""
    events = [json.loads(frame) for frame in frames if isinstance(frame, str)]
    for event in events:
        SERVER_EVENT.validate_python(event)
    return events


def _one(p: VideoSessionProtocol) -> dict[str, Any]:
    frames = p.data_to_send()
    assert len(frames) == 1 and isinstance(frames[0], str), frames
    return _texts(frames)[0]


def _session(now: float = 0.0, **options: Any) -> VideoSessionProtocol:
    ids = iter(f"generated-{n}" for n in range(100))
    return VideoSessionProtocol(
        "video_stream-1", now, VideoSessionOptions(**options), new_event_id=lambda: next(ids)
    )


def _streaming(now: float = 0.0, start: str | None = None, **options: Any) -> VideoSessionProtocol:
    p = _session(now, **options)
    p.receive_text(start or _start(), now)
    assert isinstance(p.events_received()[0], StartRequested)
    p.started(now=now)
    assert _one(p)["type"] == "video.start"
    return p


def _media(p: VideoSessionProtocol, index: int, now: float = 0.0, **ids: Any) -> None:
    data = (INIT if index == 0 else b"") + b"moof" + bytes([index]) * 32
    p.chunk(
        "media", data, now=now, produced_at=100.0 + index, generation_chunk_index=index,
        num_frames=frames_in_chunk(index), **ids,
    )  # fmt: skip


def _error(p: VideoSessionProtocol) -> dict[str, Any]:
    event = _one(p)
    assert event["type"] == "error", event
    return event


# ------------------------------------------------------------------ chunk arithmetic


def test_chunk_arithmetic_matches_the_lingbot_world_server() -> None:
    assert frames_for_chunks(16) == 189
    assert chunks_for_frames(189) == 16
    assert (frames_in_chunk(0), frames_in_chunk(1), frames_in_chunk(15)) == (9, 12, 12)
    assert (chunks_for_frames(33), chunks_for_frames(81)) == (3, 7)
    assert chunks_for_frames(8) == 0 and chunks_for_frames(9) == 1
    for chunks in range(1, 40):
        assert chunks_for_frames(frames_for_chunks(chunks)) == chunks
        assert sum(frames_in_chunk(i) for i in range(chunks)) == frames_for_chunks(chunks)
    with pytest.raises(ValueError):
        chunks_for_frames(0)
    with pytest.raises(ValueError):
        frames_for_chunks(0)


# ------------------------------------------------------------------ happy path


def test_full_session_streams_every_chunk_then_done() -> None:
    script = [[["w"], ["a"], []]] * 16
    p = _session()
    p.receive_text(_start(num_frames=189, extra_params={"camera_action_script": script}), 0.5)
    assert p.state is State.STARTING
    assert p.data_to_send() == []  # nothing until a worker admits the session
    [command] = p.events_received()
    assert isinstance(command, StartRequested) and not command.system
    assert command.config.model_dump() == {
        "width": 832, "height": 480, "fps": 16.0, "num_frames": 189, "chunks": 16,
    }  # fmt: skip
    assert command.start.extra_params.camera_action_script == script

    p.started(now=1.0)
    start = _one(p)
    assert start == {
        "type": "video.start", "request_id": "video_stream-1", "format": "m4s",
        "config": {"width": 832, "height": 480, "fps": 16.0, "num_frames": 189, "chunks": 16},
        # the resume extension
        "session_id": "video_stream-1", "resume_token": p.resume_token,
    }  # fmt: skip
    assert len(p.resume_token) >= 32
    assert p.state is State.STREAMING

    binaries: list[bytes] = []
    for index in range(16):
        _media(p, index, now=2.0 + index)
        metadata, data = p.data_to_send()  # exactly one text frame, then one binary
        assert isinstance(metadata, str) and isinstance(data, bytes)
        meta = _texts([metadata])[0]
        assert meta["type"] == "video.chunk_metadata" and meta["kind"] == "media"
        assert meta["generation_chunk_index"] == meta["transport_chunk_index"] == index
        assert meta["num_frames"] == frames_in_chunk(index)
        assert meta["byte_length"] == len(data)
        assert meta["produced_at"] == 100.0 + index
        binaries.append(data)
    assert binaries[0][4:8] == b"ftyp"  # the init segment rides in the first binary frame
    assert sum(frames_in_chunk(i) for i in range(16)) == 189

    p.chunk("trailer", b"mfra-bytes", now=20.0, produced_at=120.0)
    metadata, data = p.data_to_send()
    assert isinstance(metadata, str) and data == b"mfra-bytes"
    meta = _texts([metadata])[0]
    assert meta["kind"] == "trailer" and meta["generation_chunk_index"] is None
    assert (meta["transport_chunk_index"], meta["num_frames"]) == (16, 0)

    p.finished(stopped=False)
    assert _one(p) == {
        "type": "session.done", "request_id": "video_stream-1", "chunks": 16, "stopped": False,
    }  # fmt: skip
    assert p.state is State.DONE
    assert p.close_expected() and p.close_code == CLOSE_NORMAL
    assert p.next_deadline() is None


def test_persisted_session_reports_its_artifact() -> None:
    p = _streaming(start=_start(num_frames=9, extra_params={"persist": True}))
    _media(p, 0)
    p.data_to_send()
    p.finished(stopped=False, artifact_id="video_abc")
    assert _one(p)["artifact_id"] == "video_abc"


def test_vllm_omni_client_fields_are_accepted_and_resolved() -> None:
    """The plain vLLM-Omni client sends size/seconds and sampler knobs at the top level."""
    start = _start(
        width=None, height=None, num_frames=None, image_reference=None, extra_params=None,
        size="640x384", seconds=2, num_inference_steps=4, guidance_scale=1.0,
        sampling_params={"quality": "high"}, lora=None, some_future_field=1,
    )  # fmt: skip
    p = _session()
    p.receive_text(start, 0.0)
    [command] = p.events_received()
    assert isinstance(command, StartRequested)
    # 2 s at 16 fps = 32 frames → 2 whole chunks → 21 frames
    assert (command.config.width, command.config.height) == (640, 384)
    assert (command.config.chunks, command.config.num_frames) == (2, 21)
    assert command.start.sampling_params == {"quality": "high"}
    assert command.start.model_extra == {"some_future_field": 1}


# ------------------------------------------------------------------ session.start


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"width": 831}, "invalid_size"),
        ({"height": 0}, "invalid_size"),
        ({"width": None, "height": None, "size": "big"}, "invalid_size"),
        ({"num_frames": 8}, "invalid_num_frames"),
        ({"num_frames": 0}, "invalid_num_frames"),
        ({"format": "webm"}, "unsupported_format"),
        ({"extra_params": {"camera_action_script": [[["w"], ["w"], ["w"]]] * 2}},
         "invalid_camera_action_script"),
        ({"extra_params": {"camera_action_script": [[["w"], ["w"]]] * 3}},
         "invalid_camera_action_script"),
        ({"extra_params": {"camera_action_script": [[["w"], ["x"], []]] * 3}},
         "invalid_camera_action_script"),
        ({"extra_params": {"camera_action_script": "wwww"}}, "invalid_camera_action_script"),
        ({"image_reference": {"image_url": "file:///etc/passwd"}}, "invalid_image_reference"),
        ({"image_reference": "not-an-object"}, "invalid_image_reference"),
        ({"prompt": None}, "invalid_request"),
        ({"fps": -1}, "invalid_request"),
        ({"model": "someone/else"}, "model_not_found"),
    ],
)  # fmt: skip
def test_bad_start_is_refused_with_a_code_and_closed(fields: dict[str, Any], code: str) -> None:
    p = _session(models=frozenset({"reference/world"}))
    p.receive_text(_start(**fields), 0.0)
    error = _error(p)
    assert error["code"] == code and error["message"]
    assert "request_id" not in error
    assert p.state is State.FAILED and p.close_code == CLOSE_POLICY
    assert p.events_received() == []


def test_start_is_capped_at_4_mib() -> None:
    p = _session()
    p.receive_text(_start(prompt="x" * (4 * 1024 * 1024)), 0.0)
    assert _error(p)["code"] == "message_too_large"
    assert p.close_code == CLOSE_POLICY and p.events_received() == []

    p = _session()  # just under the cap is fine, also as UTF-8 bytes
    message = _start(prompt="x" * (4 * 1024 * 1024 - 1024)).encode()
    p.receive_text(message, 0.0)
    assert p.state is State.STARTING


@pytest.mark.parametrize(
    "first",
    ['{"type": "session.ping"}', '{"type": "session.interaction", "interaction": {}}'],
)
def test_first_message_must_be_session_start(first: str) -> None:
    p = _session()
    p.receive_text(first, 0.0)
    error = _error(p)
    assert error["code"] == "session_start_required"
    assert error["message"].startswith("Expected session.start, got: session.")
    assert p.close_code == CLOSE_POLICY and p.events_received() == []


@pytest.mark.parametrize("first", ["{not json", "[1, 2]", '{"type": "session.start", "x": NaN}'])
def test_first_message_must_be_a_json_object(first: str) -> None:
    p = _session()
    p.receive_text(first, 0.0)
    assert _error(p)["code"] == "invalid_json"
    assert p.close_code == CLOSE_POLICY


def test_binary_before_start_is_fatal() -> None:
    p = _session()
    p.receive_binary(b"\x00\x01", 0.0)
    assert _error(p)["code"] == "session_start_required"
    assert p.close_code == CLOSE_POLICY


def test_start_timeout() -> None:
    p = _session(now=100.0)
    assert p.next_deadline() == 110.0
    p.check_timeouts(109.9)
    assert p.data_to_send() == [] and not p.close_expected()
    p.check_timeouts(110.0)
    assert _error(p)["code"] == "start_timeout"
    assert p.state is State.FAILED and p.close_code == CLOSE_POLICY
    p.receive_text(_start(), 110.5)  # too late: ignored
    assert p.events_received() == [] and p.data_to_send() == []


# ------------------------------------------------------------------ liveness


def test_stall_timeout_stops_the_worker_and_closes() -> None:
    p = _streaming(now=0.0, stall_timeout=60.0)
    assert p.next_deadline() == 60.0
    p.check_timeouts(59.9)
    assert p.data_to_send() == [] and p.events_received() == []
    p.check_timeouts(60.0)
    assert p.events_received() == [StopRequested("stalled")]
    error = _error(p)
    assert (error["code"], error["request_id"]) == ("stalled", "video_stream-1")
    assert p.state is State.FAILED and p.close_code == CLOSE_INTERNAL


def test_ping_and_progress_refresh_the_stall_clock() -> None:
    p = _streaming(now=0.0)
    p.receive_text('{"type": "session.ping"}', 50.0)
    assert _one(p) == {"type": "session.pong"}
    p.check_timeouts(100.0)
    assert p.state is State.STREAMING
    _media(p, 0, now=105.0)  # a chunk is progress too
    p.data_to_send()
    p.check_timeouts(160.0)
    assert p.state is State.STREAMING and p.next_deadline() == 165.0
    p.check_timeouts(165.0)
    assert _error(p)["code"] == "stalled"


# ------------------------------------------------------------------ interactions


def _interaction(event_id: str | None = "ui-1", **interaction: Any) -> str:
    body: dict[str, Any] = {"event": {"prompt": "snow falls"}, **interaction}
    if event_id is not None:
        body["event_id"] = event_id
    return json.dumps({"type": "session.interaction", "interaction": body})


def test_interaction_is_queued_and_a_duplicate_event_id_conflicts() -> None:
    p = _streaming(start=_start(extra_params={"transition_chunks": 2}))
    p.receive_text(_interaction(transition_chunks=0), 1.0)
    [command] = p.events_received()
    assert command == InteractionRequested("ui-1", "snow falls", None, 0)
    assert command.system
    assert _one(p) == {
        "type": "session.interaction.queued", "request_id": "video_stream-1", "event_id": "ui-1",
    }  # fmt: skip

    p.receive_text(_interaction(), 2.0)
    error = _error(p)
    assert (error["code"], error["event_id"]) == ("event_id_conflict", "ui-1")
    assert error["request_id"] == "video_stream-1"
    assert p.events_received() == [] and p.state is State.STREAMING and not p.close_expected()

    # no event_id: the server makes one; no transition: the session default
    camera = json.dumps({"type": "session.interaction",
                         "interaction": {"event": {"camera": [["w"], ["w"], []]}}})  # fmt: skip
    p.receive_text(camera, 3.0)
    assert p.events_received() == [InteractionRequested("generated-0", None, [["w"], ["w"], []], 2)]
    assert _one(p)["event_id"] == "generated-0"


@pytest.mark.parametrize(
    "body",
    [
        {"event": {"prompt": "  "}},
        {"event": {}},
        {"event": {"camera": [["w"], ["up"], []]}},
        {"event": {"prompt": "p", "negative_prompt": "n"}},
        {"event_id": "", "event": {"prompt": "p"}},
        {"event": {"prompt": "p"}, "transition_chunks": -1},
        {"event": {"prompt": "p"}, "transition_chunks": True},
    ],
)
def test_bad_interaction_is_an_error_and_the_session_stays_open(body: dict[str, Any]) -> None:
    p = _streaming()
    p.receive_text(json.dumps({"type": "session.interaction", "interaction": body}), 1.0)
    assert _error(p)["code"] == "invalid_interaction"
    assert p.events_received() == [] and p.state is State.STREAMING


def test_replies_before_video_start_are_held_until_it() -> None:
    p = _session()
    p.receive_text(_start(), 0.0)
    p.receive_text('{"type": "session.ping"}', 1.0)
    p.receive_text(_interaction(), 2.0)
    assert p.data_to_send() == []
    commands = p.events_received()
    assert [type(c) for c in commands] == [StartRequested, InteractionRequested]
    p.started(now=3.0)
    kinds = [event["type"] for event in _texts(p.data_to_send())]
    assert kinds == ["video.start", "session.pong", "session.interaction.queued"]


# ------------------------------------------------------------------ stop


def test_stop_during_streaming() -> None:
    p = _streaming()
    _media(p, 0)
    assert len(p.data_to_send()) == 2
    _media(p, 1)  # produced, not yet taken by the sender when the stop arrives
    p.receive_text('{"type": "session.stop"}', 5.0)
    [command] = p.events_received()
    assert command == StopRequested("client") and command.system
    assert p.state is State.STOPPING
    assert p.data_to_send() == []  # data-class pair dropped by the interrupt
    _media(p, 2)  # the step in flight: checked, not sent
    assert p.data_to_send() == []
    p.receive_text('{"type": "session.stop"}', 6.0)  # idempotent
    assert p.events_received() == []
    p.receive_text(_interaction(), 6.5)
    assert _error(p)["code"] == "invalid_state"
    p.finished(stopped=True)
    assert _one(p) == {
        "type": "session.done", "request_id": "video_stream-1", "chunks": 1, "stopped": True,
    }  # fmt: skip
    assert p.close_code == CLOSE_NORMAL


def test_stop_while_starting_ends_without_video() -> None:
    p = _session()
    p.receive_text(_start(), 0.0)
    p.receive_text('{"type": "session.stop"}', 1.0)
    assert [type(c) for c in p.events_received()] == [StartRequested, StopRequested]
    p.finished(stopped=True)
    done = _one(p)
    assert (done["type"], done["chunks"], done["stopped"]) == ("session.done", 0, True)


# ------------------------------------------------------------------ worker misuse


def test_chunk_contiguity_is_enforced() -> None:
    p = _streaming()
    _media(p, 0)
    with pytest.raises(ProtocolError, match="chunk 2, not 1"):
        _media(p, 2)


def _no_init_segment(p: VideoSessionProtocol) -> None:
    p.chunk("media", b"moof", now=0, produced_at=0, generation_chunk_index=0, num_frames=9)


def _finished_early(p: VideoSessionProtocol) -> None:
    _media(p, 0)
    p.finished(stopped=False)  # 1 of 3 chunks


def _too_many_chunks(p: VideoSessionProtocol) -> None:
    for index in range(4):
        _media(p, index)


def _media_after_trailer(p: VideoSessionProtocol) -> None:
    _media(p, 0)
    p.chunk("trailer", b"t", now=0, produced_at=0)
    _media(p, 1)


def _indexed_trailer(p: VideoSessionProtocol) -> None:
    p.chunk("trailer", INIT, now=0, produced_at=0, generation_chunk_index=0)


def _empty_chunk(p: VideoSessionProtocol) -> None:
    p.chunk("media", b"", now=0, produced_at=0, generation_chunk_index=0, num_frames=9)


def _started_twice(p: VideoSessionProtocol) -> None:
    p.started(now=0)


@pytest.mark.parametrize(
    "misuse",
    [
        _no_init_segment,
        _finished_early,
        _too_many_chunks,
        _media_after_trailer,
        _indexed_trailer,
        _empty_chunk,
        _started_twice,
    ],
)
def test_illegal_worker_calls_raise(misuse: Callable[[VideoSessionProtocol], None]) -> None:
    with pytest.raises(ProtocolError):
        misuse(_streaming())


def test_worker_calls_before_admission_raise() -> None:
    p = _session()
    with pytest.raises(ProtocolError):
        p.failed("internal_error", "boom")
    p.receive_text(_start(), 0.0)
    with pytest.raises(ProtocolError):
        _media(p, 0)
    with pytest.raises(ProtocolError):
        p.finished(stopped=False)


# ------------------------------------------------------------------ client misuse, failures


def test_binary_from_the_client_is_an_error() -> None:
    p = _streaming()
    p.receive_binary(b"\x00" * 10, 1.0)
    assert _error(p)["code"] == "binary_not_supported"
    assert p.state is State.STREAMING and not p.close_expected()


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ('{"type": "session.resume"}', "unknown_event"),
        ('{"no_type": 1}', "unknown_event"),
        ("not json", "invalid_json"),
        (_start(), "invalid_state"),
        ('{"type": "session.interaction"}', "invalid_interaction"),
    ],
)
def test_bad_control_message_is_an_error_and_the_session_stays_open(
    message: str, code: str
) -> None:
    p = _streaming()
    p.receive_text(message, 1.0)
    assert _error(p)["code"] == code
    assert p.state is State.STREAMING and not p.close_expected()
    assert p.events_received() == []


def test_control_messages_have_their_own_cap() -> None:
    p = _streaming(max_control_bytes=1024)
    p.receive_text(_interaction(**{"pad": "x" * 2000}), 1.0)
    assert _error(p)["code"] == "message_too_large"
    assert p.state is State.STREAMING


@pytest.mark.parametrize(
    ("code", "close"),
    [("resource_exhausted", CLOSE_TRY_AGAIN), ("worker_lost", CLOSE_INTERNAL)],
)
def test_failure_sends_error_then_closes(code: str, close: int) -> None:
    p = _session()
    p.receive_text(_start(), 0.0)
    p.receive_text('{"type": "session.ping"}', 1.0)  # held reply still goes out, first
    p.failed(code, "no worker slot")
    pong, error = _texts(p.data_to_send())
    assert pong["type"] == "session.pong"
    assert (error["code"], error["request_id"]) == (code, "video_stream-1")
    assert p.state is State.FAILED and p.close_code == close


def test_failure_drops_undelivered_chunks() -> None:
    p = _streaming()
    _media(p, 0)
    p.failed("worker_lost", "the worker went away")
    assert _error(p)["code"] == "worker_lost"
    assert p.chunks_sent == 0


def test_disconnect_stops_the_worker_and_later_input_is_ignored() -> None:
    p = _streaming()
    _media(p, 0)
    p.connection_lost()
    assert p.events_received() == [StopRequested("disconnected")]
    assert p.state is State.FAILED and p.data_to_send() == []
    p.receive_text('{"type": "session.ping"}', 2.0)
    _media(p, 1)
    p.finished(stopped=True)
    p.check_timeouts(1e9)
    assert p.data_to_send() == [] and p.events_received() == []


# ------------------------------------------------------------------ caps (issue 9)

WORLD = StartLimits(max_width=1280, max_height=1280, max_frames=957, max_fps=60)


def _capped(**options: Any) -> VideoSessionProtocol:
    limits = {"reference/world": WORLD}
    return _session(models=frozenset(limits), model_limits=limits, **options)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"num_frames": 10**12}, "num_frames"),
        ({"num_frames": 958 + 12}, "num_frames"),  # one chunk past the model's max_frames
        ({"num_frames": None, "seconds": 10**9}, "seconds"),
        ({"num_frames": None, "seconds": 1e308}, "seconds"),
        ({"num_frames": None, "seconds": True}, "seconds"),
        ({"num_frames": True}, "num_frames"),
    ],
)
def test_rollout_beyond_the_models_max_frames_is_refused_before_placement(
    fields: dict[str, Any], param: str
) -> None:
    p = _capped()
    p.receive_text(_start(**{**fields, "extra_params": {}}), 0.0)
    error = _error(p)
    assert (error["code"], error["param"]) == ("invalid_num_frames", param), error
    assert p.events_received() == [] and p.close_code == CLOSE_POLICY
    assert p.config is None


def test_model_max_frames_is_accepted_and_one_chunk_more_is_not() -> None:
    p = _capped(max_session_s=None)
    p.receive_text(_start(num_frames=957, extra_params={}), 0.0)
    [cmd] = p.events_received()
    assert isinstance(cmd, StartRequested) and cmd.config.chunks == 80


def test_the_session_time_limit_bounds_num_frames_over_fps() -> None:
    # 10 s at 16 fps: 160 frames → 13 whole chunks (153 frames); 14 chunks are refused
    p = _capped(max_session_s=10.0)
    p.receive_text(_start(num_frames=165, fps=16, extra_params={}), 0.0)
    error = _error(p)
    assert (error["code"], error["param"]) == ("invalid_num_frames", "num_frames")
    assert "at most 153" in error["message"] and p.events_received() == []
    p = _capped(max_session_s=10.0)
    p.receive_text(_start(num_frames=153, fps=16, extra_params={}), 0.0)
    assert isinstance(p.events_received()[0], StartRequested)
    p = _capped(max_session_s=10.0)  # seconds are bounded the same way
    p.receive_text(_start(num_frames=None, seconds=11, fps=16, extra_params={}), 0.0)
    assert (_error(p)["param"], p.events_received()) == ("seconds", [])


def test_a_start_without_model_gets_the_default_models_caps() -> None:
    p = _capped(default_model="reference/world")
    p.receive_text(_start(model=None, num_frames=2000, extra_params={}), 0.0)
    assert (_error(p)["code"], p.events_received()) == ("invalid_num_frames", [])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"width": True}, "width"),
        ({"width": 10**100}, "width"),
        ({"width": 2048}, "width"),  # over the model's max_width
        ({"fps": True}, "fps"),
        ({"fps": 1e308}, "fps"),
        ({"fps": 61}, "fps"),  # over the model's max_fps
        ({"seed": 10**100}, "seed"),
        ({"seed": True}, "seed"),
        ({"num_inference_steps": 10**40}, "num_inference_steps"),
        ({"guidance_scale": 1e308}, "guidance_scale"),
        ({"extra_params": {"flow_shift": True}}, "extra_params.flow_shift"),
        ({"extra_params": {"transition_chunks": 10**30}}, "extra_params.transition_chunks"),
    ],
)
def test_huge_numbers_and_booleans_are_param_errors(fields: dict[str, Any], param: str) -> None:
    p = _capped()
    p.receive_text(_start(**fields), 0.0)
    error = _error(p)
    assert error["param"] == param, error
    assert p.events_received() == [] and p.close_code == CLOSE_POLICY


def test_a_live_session_ends_at_the_time_limit() -> None:
    p = _streaming(now=0.0, max_session_s=30.0, stall_timeout=60.0)
    assert p.next_deadline() == 30.0
    _media(p, 0, now=29.0)
    p.data_to_send()
    assert p.next_deadline() == 30.0  # progress refreshes the stall clock, not the limit
    p.check_timeouts(29.9)
    assert p.data_to_send() == [] and p.events_received() == []
    p.check_timeouts(30.0)
    assert p.events_received() == [StopRequested("expired")]
    error = _error(p)
    assert (error["code"], error["request_id"]) == ("session_expired", "video_stream-1")
    assert "30 s" in error["message"]
    assert p.state is State.FAILED and p.close_code == CLOSE_POLICY


# ------------------------------------------------------------------ hostile JSON (issue 9)

DEEP = "[" * 100_000
SURROGATE = '{"type": "session.start", "prompt": "\\ud800"}'


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (DEEP, None),
        ('{"type": "session.start", "prompt": "x", "seed": ' + "9" * 5000 + "}", None),
        (SURROGATE, "prompt"),
        ('{"type": "\\udfff"}', "type"),
        ('{"type": "session.start", "prompt": "x", "extra_params": {"a": '
         + "[" * 500 + "]" * 500 + "}}", "extra_params.a.0.0.…"),
    ],
)  # fmt: skip
def test_hostile_json_before_start_is_an_error_event(message: str, param: str | None) -> None:
    p = _session()
    p.receive_text(message, 0.0)
    error = _error(p)  # also checks the frame is valid JSON of the schema
    assert error["code"] == "invalid_json" and error.get("param") == param
    assert p.events_received() == [] and p.close_code == CLOSE_POLICY


@pytest.mark.parametrize(
    "message",
    [
        DEEP,
        '{"type": "session.ping", "n": ' + "9" * 5000 + "}",
        '{"type": "\\ud800"}',
        '{"type": "session.interaction", "interaction": {"event_id": "\\ud800",'
        ' "event": {"prompt": "x"}}}',
    ],
)
def test_hostile_json_after_start_keeps_the_session(message: str) -> None:
    p = _streaming()
    p.receive_text(message, 1.0)
    assert _error(p)["code"] == "invalid_json"
    assert p.state is State.STREAMING and not p.close_expected()
    assert p.events_received() == []
    p.receive_text('{"type": "session.ping"}', 2.0)
    assert _one(p)["type"] == "session.pong"


def test_escaped_surrogate_pairs_are_fine() -> None:
    p = _session()
    p.receive_text(_start(prompt="a red \U0001f388 at sunset"), 0.0)  # json.dumps escapes it
    [cmd] = p.events_received()
    assert isinstance(cmd, StartRequested) and cmd.start.prompt.endswith("\U0001f388 at sunset")
