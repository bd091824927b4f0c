"""Sans-I/O tests of the ``WS /v1/realtime`` session: ``session.created`` defaults,
``session.update`` (GA and beta spellings, refused values), bad and hostile client
events, the session time limit. Events in, events out (``realtime_client.Client``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from realtime.audio_protocol import State, Stop, VoiceSessionOptions, VoiceSessionProtocol
from tests.unit.realtime_client import SDK, Client, ScriptedVAD, silence, speech


def test_session_created_has_the_spec_defaults() -> None:
    c = Client()
    (created,) = c.events
    assert created["type"] == "session.created"
    session = created["session"]
    assert session["type"] == "realtime"
    assert session["model"] == "reference/voice"
    assert session["output_modalities"] == ["audio"]
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    td = session["audio"]["input"]["turn_detection"]
    assert td == {
        "type": "server_vad",
        "threshold": 0.5,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
        "create_response": True,
        "interrupt_response": True,
        "idle_timeout_ms": None,
    }
    assert "capabilities" not in session and "server_event_seq" not in created


def test_session_update_applies_and_echoes() -> None:
    c = Client()
    out = c.send(
        {
            "type": "session.update",
            "event_id": "ev1",
            "session": {
                "type": "realtime",
                "instructions": "be brief",
                "audio": {
                    "output": {"voice": "marin", "speed": 1.2},
                    "input": {"turn_detection": {"type": "server_vad", "threshold": 0.7}},
                },
            },
        }
    )
    assert c.types(out) == ["session.updated"]
    session = out[0]["session"]
    assert session["instructions"] == "be brief"
    assert session["audio"]["output"]["voice"] == "marin"
    assert session["audio"]["input"]["turn_detection"]["threshold"] == 0.7
    assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500


@pytest.mark.parametrize(
    ("update", "param"),
    [
        (
            {"audio": {"input": {"format": {"type": "audio/pcmu"}}}},
            "session.audio.input.format.type",
        ),
        (
            {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "session.audio.output.format.rate",
        ),
        (
            {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
            "session.audio.input.turn_detection.type",
        ),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "session.tools"),
        ({"output_modalities": ["text"]}, "session.output_modalities"),
        ({"audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
        ({"audio": {"output": {"speed": 3.0}}}, "session.audio.output.speed"),
        (
            {"audio": {"input": {"turn_detection": {"threshold": 2}}}},
            "session.audio.input.turn_detection.threshold",
        ),
        ({"type": "transcription"}, "session.type"),
        ({"model": "other"}, "session.model"),
    ],
)
def test_unsupported_session_values_are_refused_and_change_nothing(
    update: dict[str, Any], param: str
) -> None:
    c = Client()
    before = c.p.session.model_dump()
    out = c.send({"type": "session.update", "event_id": "evX", "session": update})
    assert c.types(out) == ["error"]
    assert out[0]["error"]["param"] == param
    assert out[0]["error"]["event_id"] == "evX"
    assert c.p.session.model_dump() == before
    assert c.p.state is State.OPEN


@pytest.mark.parametrize(
    ("text", "code", "param"),
    [
        ("not json", "invalid_json", None),
        (json.dumps({"no": "type"}), "missing_required_parameter", "type"),
        (json.dumps({"type": "bogus.event"}), "invalid_value", "type"),
        (json.dumps({"type": "session.heartbeat"}), "invalid_value", "type"),
        (
            json.dumps({"type": "input_audio_buffer.append", "audio": "***"}),
            "invalid_value",
            "audio",
        ),
        (
            json.dumps({"type": "input_audio_buffer.append", "audio": "AA=="}),
            "invalid_value",
            "audio",
        ),
        (json.dumps({"type": "input_audio_buffer.append"}), "missing_required_parameter", "audio"),
        (
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "item_id": "x",
                    "content_index": 0,
                    "audio_end_ms": -1,
                }
            ),
            "invalid_value",
            "audio_end_ms",
        ),
    ],
)
def test_bad_client_events_are_errors_and_the_session_goes_on(
    text: str, code: str, param: str | None
) -> None:
    c = Client()
    c.p.receive_text(text, c.now)
    out = c.pump()
    assert c.types(out) == ["error"]
    assert out[0]["error"]["code"] == code
    assert out[0]["error"].get("param") == param
    assert c.p.state is State.OPEN and not c.cmds


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ("[" * 100_000, None),
        ("{" * 50_000, None),
        ('{"type": "session.update", "session": {"instructions": ' + "9" * 5000 + "}}", None),
        ('{"type": "session.update", "session": {"instructions": "\\ud800"}}',
         "session.instructions"),
        ('{"type": "\\ud800", "event_id": "\\udc00"}', "type"),
        ('{"type": "session.update", "session": {"x": ' + "[" * 500 + "]" * 500 + "}}",
         "session.x.0.0.…"),
    ],
)  # fmt: skip
def test_hostile_json_is_an_error_event_and_the_session_goes_on(
    text: str, param: str | None
) -> None:
    c = Client()
    before = c.p.session.model_dump()
    c.p.receive_text(text, c.now)
    out = c.pump()
    assert c.types(out) == ["error"]
    error = out[0]["error"]
    assert (error["type"], error["code"], error.get("param")) == (
        "invalid_request_error",
        "invalid_json",
        param,
    )
    assert c.p.state is State.OPEN and not c.cmds and c.p.session.model_dump() == before
    assert c.types(c.send({"type": "input_audio_buffer.clear"})) == ["input_audio_buffer.cleared"]


# ------------------------------------------------------------------ issue 9: beta session keys


def test_beta_turn_detection_null_turns_server_vad_off() -> None:
    c = Client()
    assert c.p.vad_active
    out = c.send({"type": "session.update", "session": {"turn_detection": None}})
    assert c.types(out) == ["session.updated"]
    assert out[0]["session"]["audio"]["input"]["turn_detection"] is None
    assert not c.p.vad_active
    # manual turns now: speech alone starts nothing
    assert c.types(c.append(speech(300) + silence(800))) == []


def test_the_beta_session_shape_of_the_openai_sdk_is_accepted() -> None:
    from openai.types.beta.realtime.session_update_event import (
        Session as BetaSession,
    )
    from openai.types.beta.realtime.session_update_event import (
        SessionTurnDetection,
        SessionUpdateEvent,
    )

    event = SessionUpdateEvent(
        type="session.update",
        session=BetaSession(
            modalities=["text", "audio"],
            instructions="be brief",
            voice="verse",
            speed=1.1,
            input_audio_format="pcm16",
            output_audio_format="pcm16",
            turn_detection=SessionTurnDetection(
                type="server_vad", threshold=0.6, silence_duration_ms=700
            ),
            input_audio_transcription=None,
            max_response_output_tokens="inf",
        ),
    )
    c = Client()
    out = c.send(event.model_dump(exclude_unset=True))
    assert c.types(out) == ["session.updated"]
    session = out[0]["session"]
    assert session["output_modalities"] == ["audio"]
    assert session["instructions"] == "be brief"
    assert session["audio"]["output"]["voice"] == "verse"
    assert session["audio"]["output"]["speed"] == 1.1
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    td = session["audio"]["input"]["turn_detection"]
    assert (td["threshold"], td["silence_duration_ms"]) == (0.6, 700)


def test_the_ga_spelling_wins_over_its_beta_alias() -> None:
    c = Client()
    out = c.send(
        {
            "type": "session.update",
            "session": {"voice": "ash", "audio": {"output": {"voice": "marin"}}},
        }
    )
    assert out[0]["session"]["audio"]["output"]["voice"] == "marin"


@pytest.mark.parametrize(
    ("update", "code", "param"),
    [
        ({"voice": "nobody"}, "unsupported_value", "session.voice"),
        ({"input_audio_format": "g711_ulaw"}, "unsupported_value", "session.input_audio_format"),
        ({"output_audio_format": "mp3"}, "invalid_value", "session.output_audio_format"),
        ({"modalities": ["text"]}, "unsupported_value", "session.modalities"),
        ({"turn_detection": {"type": "server_vad", "threshold": 2}}, "invalid_value",
         "session.turn_detection.threshold"),
        ({"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}, "unsupported_value",
         "session.turn_detection.type"),
        ({"speed": 9}, "invalid_value", "session.speed"),
        ({"turn_detecton": None}, "unknown_parameter", "session.turn_detecton"),
        ({"temperature": 0.8}, "unknown_parameter", "session.temperature"),
        ({"audio": {"input": {"vad": None}}}, "unknown_parameter", "session.audio.input.vad"),
        ({"audio": {"input": {"turn_detection": {"eagerness": "low"}}}}, "unknown_parameter",
         "session.audio.input.turn_detection.eagerness"),
        ({"prompt": {"id": "pmpt_1"}}, "unsupported_value", "session.prompt"),
        ({"id": "sess_other"}, "invalid_value", "session.id"),
    ],
)  # fmt: skip
def test_unknown_keys_and_bad_beta_values_are_refused_by_name(
    update: dict[str, Any], code: str, param: str
) -> None:
    c = Client()
    before = c.p.session.model_dump()
    out = c.send({"type": "session.update", "event_id": "evB", "session": update})
    assert c.types(out) == ["error"]
    error = out[0]["error"]
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evB")
    assert param in error["message"] or code != "unknown_parameter"
    assert c.p.session.model_dump() == before and c.p.vad_active


def test_the_session_object_echoed_back_is_accepted() -> None:
    c = Client(duplex=True)
    session = c.events[0]["session"]
    out = c.send({"type": "session.update", "session": session})
    assert c.types(out) == ["session.updated"]


# ------------------------------------------------------------------ issue 9: time limit


def test_a_voice_session_ends_at_the_time_limit() -> None:
    p = VoiceSessionProtocol(
        "sess_t",
        VoiceSessionOptions(model="reference/voice", max_session_s=60.0),
        ScriptedVAD,
        10.0,
    )
    p.data_to_send()
    assert p.next_deadline() == 70.0
    p.check_timeouts(69.9)
    assert p.data_to_send() == [] and not p.close_expected()
    p.check_timeouts(70.0)
    [frame] = p.data_to_send()
    event = json.loads(frame)
    SDK["error"].model_validate(event)
    assert event["error"]["code"] == "session_expired" and "60 s" in event["error"]["message"]
    assert p.close_expected() and p.close_code == 1008
    assert [c for c in p.commands() if isinstance(c, Stop)] == [Stop("expired")]
