"""``session.start`` of ``WS /v1/realtime/video``, driven without a socket: what a start
may hold, the per-model caps and time limit, hostile JSON before and after it."""

from __future__ import annotations

from typing import Any

import pytest

from models.catalog import REFERENCE_WORLD
from models.realtime_video_start import StartLimits
from realtime.video_protocol import (
    CLOSE_POLICY,
    StartRequested,
    State,
    WorldSessionProtocol,
)
from tests.unit.world_session_client import (
    error_event,
    interaction_json,
    new_session,
    one_event,
    send_media,
    start_json,
    streaming,
    timed_out,
)

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
    p = new_session(models=frozenset({"reference/world"}))
    error = _refused(p, **fields)
    assert error["code"] == code and error["message"]
    assert "request_id" not in error
    assert p.state is State.FAILED and p.close_code == CLOSE_POLICY
    assert p.events_received() == []


def test_start_is_capped_at_4_mib() -> None:
    p = new_session()
    p.receive_text(start_json(prompt="x" * (4 * 1024 * 1024)), 0.0)
    assert error_event(p)["code"] == "message_too_large"
    assert p.close_code == CLOSE_POLICY and p.events_received() == []

    p = new_session()  # just under the cap is fine, also as UTF-8 bytes
    message = start_json(prompt="x" * (4 * 1024 * 1024 - 1024)).encode()
    p.receive_text(message, 0.0)
    assert p.state is State.STARTING


@pytest.mark.parametrize(
    "first",
    ['{"type": "session.ping"}', '{"type": "session.interaction", "interaction": {}}'],
)
def test_first_message_must_be_session_start(first: str) -> None:
    p = new_session()
    p.receive_text(first, 0.0)
    error = error_event(p)
    assert error["code"] == "session_start_required"
    assert error["message"].startswith("Expected session.start, got: session.")
    assert p.close_code == CLOSE_POLICY and p.events_received() == []


@pytest.mark.parametrize("first", ["{not json", "[1, 2]", '{"type": "session.start", "x": NaN}'])
def test_first_message_must_be_a_json_object(first: str) -> None:
    p = new_session()
    p.receive_text(first, 0.0)
    assert error_event(p)["code"] == "invalid_json"
    assert p.close_code == CLOSE_POLICY


def test_binary_before_start_is_fatal() -> None:
    p = new_session()
    p.receive_binary(b"\x00\x01", 0.0)
    assert error_event(p)["code"] == "session_start_required"
    assert p.close_code == CLOSE_POLICY


def test_start_timeout() -> None:
    p = new_session(now=100.0)
    assert p.next_deadline() == 110.0
    p.check_timeouts(109.9)
    assert p.data_to_send() == [] and not p.close_expected()
    p.check_timeouts(110.0)
    assert error_event(p)["code"] == "start_timeout"
    assert p.state is State.FAILED and p.close_code == CLOSE_POLICY
    p.receive_text(start_json(), 110.5)  # too late: ignored
    assert p.events_received() == [] and p.data_to_send() == []


# ------------------------------------------------------------------ caps (issue 9)

WORLD = StartLimits(max_width=1280, max_height=1280, max_frames=957, max_fps=60)


def _refused(p: WorldSessionProtocol, **fields: Any) -> dict[str, Any]:
    """The error event a start of these fields gets."""
    p.receive_text(start_json(**fields), 0.0)
    return error_event(p)


def _capped(**options: Any) -> WorldSessionProtocol:
    limits = {"reference/world": WORLD}
    return new_session(models=frozenset(limits), model_limits=limits, **options)


@pytest.mark.parametrize("model", [None, "reference/world"])
def test_a_server_with_no_world_model_says_so_naming_model(model: str | None) -> None:
    """A registry without a streaming video model (``omniqueue up`` then starts no realtime
    worker): every start is refused at once, saying which kind of model is missing."""
    p = new_session(models=frozenset())
    error = _refused(p, model=model)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "serves no world model" in error["message"]
    assert p.events_received() == [] and p.close_code == CLOSE_POLICY


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
    error = _refused(p, **{**fields, "extra_params": {}})
    assert (error["code"], error["param"]) == ("invalid_num_frames", param), error
    assert p.events_received() == [] and p.close_code == CLOSE_POLICY
    assert p.config is None


def test_model_max_frames_is_accepted_and_one_chunk_more_is_not() -> None:
    p = _capped(max_session_s=None)
    p.receive_text(start_json(num_frames=957, extra_params={}), 0.0)
    [cmd] = p.events_received()
    assert isinstance(cmd, StartRequested) and cmd.config.chunks == 80


def test_the_session_time_limit_bounds_num_frames_over_fps() -> None:
    # 10 s at 16 fps: 160 frames → 13 whole chunks (153 frames); 14 chunks are refused
    p = _capped(max_session_s=10.0)
    error = _refused(p, num_frames=165, fps=16, extra_params={})
    assert (error["code"], error["param"]) == ("invalid_num_frames", "num_frames")
    assert "at most 153" in error["message"] and p.events_received() == []
    p = _capped(max_session_s=10.0)
    p.receive_text(start_json(num_frames=153, fps=16, extra_params={}), 0.0)
    assert isinstance(p.events_received()[0], StartRequested)
    p = _capped(max_session_s=10.0)  # seconds are bounded the same way
    p.receive_text(start_json(num_frames=None, seconds=11, fps=16, extra_params={}), 0.0)
    assert (error_event(p)["param"], p.events_received()) == ("seconds", [])


def test_a_start_without_model_gets_the_default_models_caps() -> None:
    p = _capped(default_model="reference/world")
    p.receive_text(start_json(model=None, num_frames=2000, extra_params={}), 0.0)
    assert (error_event(p)["code"], p.events_received()) == ("invalid_num_frames", [])


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
    error = _refused(p, **fields)
    assert error["param"] == param, error
    assert p.events_received() == [] and p.close_code == CLOSE_POLICY


def test_a_live_session_ends_at_the_time_limit() -> None:
    p = streaming(now=0.0, max_session_s=30.0, stall_timeout=60.0)
    assert p.next_deadline() == 30.0
    send_media(p, 0, now=29.0)
    p.data_to_send()
    assert p.next_deadline() == 30.0  # progress refreshes the stall clock, not the limit
    error = timed_out(p, 30.0, "expired")
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
    p = new_session()
    p.receive_text(message, 0.0)
    error = error_event(p)  # also checks the frame is valid JSON of the schema
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
    p = streaming()
    p.receive_text(message, 1.0)
    assert error_event(p)["code"] == "invalid_json"
    assert p.state is State.STREAMING and not p.close_expected()
    assert p.events_received() == []
    p.receive_text('{"type": "session.ping"}', 2.0)
    assert one_event(p)["type"] == "session.pong"


def test_escaped_surrogate_pairs_are_fine() -> None:
    p = new_session()
    p.receive_text(start_json(prompt="a red \U0001f388 at sunset"), 0.0)  # json.dumps escapes it
    [cmd] = p.events_received()
    assert isinstance(cmd, StartRequested) and cmd.start.prompt.endswith("\U0001f388 at sunset")


# ------------------------------------------------------------ the model's rules (issue 31)

# A world model of another shape: chunks of 33 frames (Helios'), sizes in 32s, 384x640 at
# 24 fps by default, no camera conditioning.
HELIOS_LIKE = REFERENCE_WORLD.model_copy(
    update={
        "name": "helios-like",
        "frame_offset": 33,
        "frame_multiple": 33,
        "size_multiple": 32,
        "default_size": (640, 384),
        "default_fps": 24,
        "default_seconds": 5.5,
        "max_frames": 33 * 20,
        "camera_control": False,
    }
)


def _served(*specs: Any) -> WorldSessionProtocol:
    limits = {s.name: StartLimits.of(s) for s in specs}
    return new_session(models=frozenset(limits), model_limits=limits, default_model=specs[0].name)


def _start(p: WorldSessionProtocol, **fields: Any) -> Any:
    p.receive_text(start_json(**fields), 0.0)
    [cmd] = p.events_received()
    assert isinstance(cmd, StartRequested)
    return cmd.config


def test_a_start_that_leaves_things_out_gets_the_model_s_defaults() -> None:
    none = {"width": None, "height": None, "num_frames": None, "fps": None, "extra_params": {}}
    config = _start(_served(HELIOS_LIKE), model="helios-like", **none)
    # 5.5 s at 24 fps = 132 frames: 4 whole chunks of 33
    assert (config.width, config.height, config.fps) == (640, 384, 24.0)
    assert (config.num_frames, config.chunks) == (132, 4)
    world = _start(_served(REFERENCE_WORLD), model="reference/world", **none)
    assert (world.width, world.height, world.fps) == (480, 272, 16.0)
    assert (world.num_frames, world.chunks) == (189, 16)  # the spec's default_seconds


def test_steps_per_chunk_are_the_start_s_or_the_model_s_default_within_its_range() -> None:
    """``num_inference_steps`` is every chunk's denoise steps (echoed in the config the
    worker gets); left out, the model's ``default_steps``; out of its range, refused."""
    config = _start(_served(HELIOS_LIKE), model="helios-like", extra_params={})
    assert config.num_inference_steps == HELIOS_LIKE.default_steps
    steps = _start(
        _served(HELIOS_LIKE), model="helios-like", num_inference_steps=3, extra_params={}
    )
    assert steps.num_inference_steps == 3
    p = _served(HELIOS_LIKE)
    too_many = HELIOS_LIKE.max_steps + 1
    error = _refused(p, model="helios-like", num_inference_steps=too_many, extra_params={})
    assert (error["code"], error["param"]) == ("invalid_request", "num_inference_steps")
    assert f"between 1 and {HELIOS_LIKE.max_steps}" in error["message"]
    assert p.events_received() == []
    fixed = HELIOS_LIKE.model_copy(update={"min_steps": 4, "max_steps": 4, "default_steps": 4})
    error = _refused(_served(fixed), model="helios-like", num_inference_steps=5, extra_params={})
    assert "num_inference_steps must be 4 for helios-like, got 5" in error["message"], error


def test_num_frames_rounds_down_to_the_model_s_chunks() -> None:
    config = _start(_served(HELIOS_LIKE), model="helios-like", num_frames=100, extra_params={})
    assert (config.num_frames, config.chunks) == (99, 3)
    error = _refused(_served(HELIOS_LIKE), model="helios-like", num_frames=32, extra_params={})
    assert (error["code"], error["param"]) == ("invalid_num_frames", "num_frames")
    assert "at least 33" in error["message"]


def test_the_size_lattice_is_the_model_s() -> None:
    error = _refused(_served(HELIOS_LIKE), model="helios-like", width=656, extra_params={})
    assert (error["code"], error["param"]) == ("invalid_size", "width")
    assert "multiples of 32" in error["message"]


def test_a_camera_script_for_a_model_without_camera_is_refused_naming_it() -> None:
    p = _served(HELIOS_LIKE, REFERENCE_WORLD)
    script = {"camera_action_script": [[["w"], ["w"], ["w"]]]}
    error = _refused(p, model="helios-like", num_frames=33, extra_params=script)
    assert error["code"] == "invalid_camera_action_script"
    assert error["param"] == "extra_params.camera_action_script"
    assert "no camera" in error["message"] and p.events_received() == []
    # reference/world keeps it
    assert _start(_served(HELIOS_LIKE, REFERENCE_WORLD), model="reference/world").chunks == 3


def test_a_camera_interaction_for_a_model_without_camera_is_refused_naming_it() -> None:
    p = streaming(
        start=start_json(model="helios-like", num_frames=99, extra_params={}),
        models=frozenset({"helios-like"}),
        model_limits={"helios-like": StartLimits.of(HELIOS_LIKE)},
    )
    camera = {"event": {"camera": [["w"], ["w"], ["w"]]}}
    p.receive_text(interaction_json("cam-1", **camera), 0.0)
    error = error_event(p)
    assert (error["code"], error["param"]) == ("invalid_request", "interaction.event.camera")
    assert p.events_received() == []
    p.receive_text(interaction_json("cam-1"), 0.0)  # a prompt is fine, and the id is free
    assert [type(c).__name__ for c in p.events_received()] == ["InteractionRequested"]
