"""Interactions of ``WS /v1/realtime/video`` (steering during a session), driven without a
socket: queued once per event id, refused when malformed, held until ``video.start``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from realtime.video_protocol import InteractionRequested, StartRequested, State
from tests.unit.world_session_client import (
    error_event,
    interaction_json,
    new_session,
    one_event,
    start_json,
    streaming,
    texts,
)

# ------------------------------------------------------------------ interactions


def test_interaction_is_queued_and_a_duplicate_event_id_conflicts() -> None:
    p = streaming(start=start_json(extra_params={"transition_chunks": 2}))
    p.receive_text(interaction_json(transition_chunks=0), 1.0)
    [command] = p.events_received()
    assert command == InteractionRequested("ui-1", "snow falls", None, 0)
    assert command.system
    assert one_event(p) == {
        "type": "session.interaction.queued", "request_id": "video_stream-1", "event_id": "ui-1",
    }  # fmt: skip

    p.receive_text(interaction_json(), 2.0)
    error = error_event(p)
    assert (error["code"], error["event_id"]) == ("event_id_conflict", "ui-1")
    assert error["request_id"] == "video_stream-1"
    assert p.events_received() == [] and p.state is State.STREAMING and not p.close_expected()

    # no event_id: the server makes one; no transition: the session default
    camera = json.dumps({"type": "session.interaction",
                         "interaction": {"event": {"camera": [["w"], ["w"], []]}}})  # fmt: skip
    p.receive_text(camera, 3.0)
    assert p.events_received() == [InteractionRequested("generated-0", None, [["w"], ["w"], []], 2)]
    assert one_event(p)["event_id"] == "generated-0"


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
    p = streaming()
    p.receive_text(json.dumps({"type": "session.interaction", "interaction": body}), 1.0)
    assert error_event(p)["code"] == "invalid_interaction"
    assert p.events_received() == [] and p.state is State.STREAMING


def test_replies_before_video_start_are_held_until_it() -> None:
    p = new_session()
    p.receive_text(start_json(), 0.0)
    p.receive_text('{"type": "session.ping"}', 1.0)
    p.receive_text(interaction_json(), 2.0)
    assert p.data_to_send() == []
    commands = p.events_received()
    assert [type(c) for c in commands] == [StartRequested, InteractionRequested]
    p.started(now=3.0)
    kinds = [event["type"] for event in texts(p.data_to_send())]
    assert kinds == ["video.start", "session.pong", "session.interaction.queued"]
