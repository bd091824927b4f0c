"""Sans-I/O tests of the ``WS /v1/realtime`` state machine: events in, events out.

Every OpenAI event the machine emits is validated against the OpenAI Python SDK's own
event model of that type (``openai.types.realtime``), so a drift from the GA wire shape
fails here. The voice-activity detector is scripted (the real one is tested in
``test_vad.py`` on speech fixtures).
"""

from __future__ import annotations

import base64
import json
import typing
from dataclasses import dataclass
from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent

from realtime.audio_protocol import (
    BYTES_PER_MS,
    Cancel,
    RealtimeOptions,
    RealtimeProtocol,
    Respond,
    State,
    Stop,
)


def _sdk_classes() -> dict[str, type]:
    union = typing.get_args(RealtimeServerEvent)[0]
    out = {}
    for cls in typing.get_args(union):
        literal = cls.model_fields["type"].annotation
        out[typing.get_args(literal)[0]] = cls
    return out


SDK = _sdk_classes()
EXTENSIONS = {
    "session.heartbeat_ack",
    "session.closed",
    "session.resumed",
    "session.resync_required",
    "playback.acknowledged",
}


@dataclass
class VadEvent:
    kind: str
    audio_ms: int


class ScriptedVAD:
    """Reports speech wherever the PCM has a non-zero sample (a 10 ms grid), with the
    silence rule of the real detector."""

    def __init__(self, threshold: float, silence_duration_ms: int) -> None:
        self.threshold = threshold
        self.silence_ms = silence_duration_ms
        self.pos_ms = 0
        self.speaking = False
        self.last_voiced = 0

    def configure(self, *, threshold: float, silence_duration_ms: int) -> None:
        self.threshold, self.silence_ms = threshold, silence_duration_ms

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        events = []
        for off in range(0, len(pcm16), 10 * BYTES_PER_MS):
            voiced = any(pcm16[off : off + 10 * BYTES_PER_MS])
            if voiced:
                if not self.speaking:
                    self.speaking = True
                    events.append(VadEvent("speech_started", self.pos_ms))
                self.last_voiced = self.pos_ms + 10
            elif self.speaking and self.pos_ms + 10 - self.last_voiced >= self.silence_ms:
                self.speaking = False
                events.append(VadEvent("speech_stopped", self.last_voiced))
            self.pos_ms += 10
        return events


def speech(ms: int) -> bytes:
    return b"\x10\x00" * (ms * BYTES_PER_MS // 2)


def silence(ms: int) -> bytes:
    return b"\x00" * (ms * BYTES_PER_MS)


class Client:
    """Drives a protocol and keeps every event it emitted, checked against the SDK."""

    def __init__(self, duplex: bool = False, turn_detection: Any = "default") -> None:
        self.now = 100.0
        self.p = RealtimeProtocol(
            "sess_test", RealtimeOptions(model="reference/voice", duplex=duplex), ScriptedVAD, 0.0
        )
        self.events: list[dict[str, Any]] = []
        self.cmds: list[Any] = []
        self.pump()
        if turn_detection is None:
            self.send(
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"turn_detection": None}}},
                }
            )

    def pump(self) -> list[dict[str, Any]]:
        new = [json.loads(f) for f in self.p.data_to_send()]
        for event in new:
            if event["type"] not in EXTENSIONS:
                SDK[event["type"]].model_validate(event)
        self.events += new
        self.cmds += self.p.commands()
        return new

    def send(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        self.p.receive_text(json.dumps(event), self.now)
        return self.pump()

    def append(self, pcm: bytes) -> list[dict[str, Any]]:
        return self.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
        )

    def types(self, events: list[dict[str, Any]] | None = None) -> list[str]:
        return [e["type"] for e in (self.events if events is None else events)]

    def respond(self) -> Respond:
        responds = [c for c in self.cmds if isinstance(c, Respond)]
        assert responds
        return responds[-1]


RESPONSE_START = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
]
RESPONSE_END = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


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


def test_manual_commit_makes_a_user_item() -> None:
    c = Client(turn_detection=None)
    assert c.types(c.append(speech(300))) == []
    out = c.send({"type": "input_audio_buffer.commit"})
    assert c.types(out) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    item = out[1]["item"]
    assert item["role"] == "user" and item["content"][0]["type"] == "input_audio"
    assert out[0]["item_id"] == item["id"] and out[0]["previous_item_id"] is None
    empty = c.send({"type": "input_audio_buffer.commit", "event_id": "e2"})
    assert empty[0]["error"]["code"] == "input_audio_buffer_commit_empty"


def test_clear_drops_the_buffer() -> None:
    c = Client(turn_detection=None)
    c.append(speech(100))
    assert c.types(c.send({"type": "input_audio_buffer.clear"})) == ["input_audio_buffer.cleared"]
    assert c.send({"type": "input_audio_buffer.commit"})[0]["type"] == "error"


def run_response(c: Client, deltas: int = 3) -> str:
    out = c.send({"type": "response.create"})
    assert c.types(out) == RESPONSE_START
    rid = c.respond().response_id
    for i in range(deltas):
        c.p.worker_audio(rid, speech(40), f"w{i} ", 1.0)
    c.pump()
    return rid


def test_full_response_sequence() -> None:
    c = Client(turn_detection=None)
    c.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        }
    )
    start = len(c.events)
    rid = run_response(c)
    assert c.respond().text == "hi"
    c.p.worker_finished(rid, "completed", c.now)
    c.pump()
    seq = c.types(c.events[start:])
    assert seq[:4] == RESPONSE_START
    assert (
        seq[4:10] == ["response.output_audio.delta", "response.output_audio_transcript.delta"] * 3
    )
    assert seq[10:] == RESPONSE_END
    done = c.events[-1]["response"]
    assert done["status"] == "completed" and done["id"] == rid
    assert done["output"][0]["content"][0]["transcript"] == "w0 w1 w2 "
    assert done["usage"]["output_tokens"] == 2  # 120 ms of audio, 100 ms per token
    deltas = [e for e in c.events if e["type"] == "response.output_audio.delta"]
    assert b"".join(base64.b64decode(e["delta"]) for e in deltas) == speech(120)


def test_one_response_at_a_time() -> None:
    c = Client(turn_detection=None)
    run_response(c)
    out = c.send({"type": "response.create"})
    assert out[0]["error"]["code"] == "conversation_already_has_active_response"


def test_response_cancel_stops_audio_at_once_and_done_follows_the_worker() -> None:
    c = Client(turn_detection=None)
    rid = run_response(c, deltas=1)
    out = c.send({"type": "response.cancel"})
    assert out == []
    assert Cancel(rid, "client_cancelled") in c.cmds
    c.p.worker_audio(rid, speech(40), "late", 1.0)  # in flight: dropped
    assert c.pump() == []
    c.p.worker_finished(rid, "cancelled", c.now)
    end = c.pump()
    assert c.types(end) == RESPONSE_END
    status = end[-1]["response"]
    assert status["status"] == "cancelled"
    assert status["status_details"]["type"] == "cancelled"
    assert status["status_details"]["reason"] == "client_cancelled"
    assert end[-1]["response"]["output"][0]["status"] == "incomplete"
    again = c.send({"type": "response.cancel"})
    assert again[0]["error"]["code"] == "response_cancel_not_active"


def test_cancel_of_another_response_id_is_an_error() -> None:
    c = Client(turn_detection=None)
    run_response(c, deltas=0)
    out = c.send({"type": "response.cancel", "response_id": "resp_other"})
    assert out[0]["error"]["param"] == "response_id"
    assert not any(isinstance(x, Cancel) for x in c.cmds)


def test_a_silent_worker_still_gets_response_done_after_the_grace() -> None:
    c = Client(turn_detection=None)
    run_response(c, deltas=0)
    c.send({"type": "response.cancel"})
    deadline = c.p.next_deadline()
    assert deadline is not None
    c.p.check_timeouts(deadline + 0.01)
    assert c.types(c.pump())[-1] == "response.done"
    assert c.p.active is None


def test_server_vad_commits_and_responds_with_the_turn_audio() -> None:
    c = Client()
    c.append(silence(500))
    started = c.append(speech(400))
    assert c.types(started) == ["input_audio_buffer.speech_started"]
    assert started[0]["audio_start_ms"] == 500 - 300  # onset minus prefix padding
    out = c.append(silence(600))
    assert c.types(out)[:4] == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert c.types(out)[4:] == RESPONSE_START
    assert out[0]["audio_end_ms"] == 900 + 500
    assert out[0]["item_id"] == started[0]["item_id"] == out[1]["item_id"]
    turn = c.respond()
    # the item holds prefix padding + speech + the silence that ended it
    assert len(turn.pcm16) == (300 + 400 + 500) * BYTES_PER_MS
    assert turn.pcm16[300 * BYTES_PER_MS : 700 * BYTES_PER_MS] == speech(400)


def test_barge_in_cancels_with_turn_detected() -> None:
    c = Client()
    c.append(speech(300) + silence(600))
    rid = c.respond().response_id
    c.p.worker_audio(rid, speech(40), None, 1.0)
    c.pump()
    out = c.append(speech(200))
    assert c.types(out) == ["input_audio_buffer.speech_started"]
    assert c.cmds[-1] == Cancel(rid, "turn_detected")
    c.p.worker_audio(rid, speech(40), None, 1.0)
    assert c.pump() == []
    c.p.worker_finished(rid, "cancelled", c.now)
    done = c.pump()[-1]
    assert done["response"]["status_details"]["reason"] == "turn_detected"


def test_no_barge_in_when_interrupt_response_is_off() -> None:
    c = Client()
    c.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}
                }
            },
        }
    )
    c.append(speech(300) + silence(600))
    rid = c.respond().response_id
    c.append(speech(200))
    assert not any(isinstance(x, Cancel) for x in c.cmds)
    c.p.worker_audio(rid, speech(40), None, 1.0)
    assert c.types(c.pump()) == ["response.output_audio.delta"]


def test_create_response_false_only_commits() -> None:
    c = Client()
    c.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "create_response": False}}
                }
            },
        }
    )
    out = c.append(speech(300) + silence(600))
    assert "input_audio_buffer.committed" in c.types(out)
    assert "response.created" not in c.types(out)


def test_items_create_retrieve_delete_and_order() -> None:
    c = Client(turn_detection=None)
    a = c.send(
        {
            "type": "conversation.item.create",
            "item": {
                "id": "item_a",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}],
            },
        }
    )
    assert c.types(a) == ["conversation.item.added", "conversation.item.done"]
    audio = base64.b64encode(speech(50)).decode()
    c.send(
        {
            "type": "conversation.item.create",
            "previous_item_id": "root",
            "item": {
                "id": "item_b",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": audio}],
            },
        }
    )
    assert c.p.conversation.ids() == ["item_b", "item_a"]
    got = c.send({"type": "conversation.item.retrieve", "item_id": "item_b"})
    assert got[0]["type"] == "conversation.item.retrieved"
    assert got[0]["item"]["content"][0]["audio"] == audio
    assert c.types(c.send({"type": "conversation.item.delete", "item_id": "item_b"})) == [
        "conversation.item.deleted"
    ]
    for bad in (
        {"type": "conversation.item.delete", "item_id": "item_b"},
        {"type": "conversation.item.retrieve", "item_id": "nope"},
        {
            "type": "conversation.item.create",
            "previous_item_id": "nope",
            "item": {"type": "message", "role": "user", "content": []},
        },
        {
            "type": "conversation.item.create",
            "item": {"id": "item_a", "type": "message", "role": "user", "content": []},
        },
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "system", "content": [{"type": "input_audio"}]},
        },
    ):
        assert c.send(bad)[0]["type"] == "error", bad
    assert c.p.conversation.ids() == ["item_a"]


def test_truncate_drops_unheard_audio_and_transcript() -> None:
    c = Client(turn_detection=None)
    rid = run_response(c, deltas=5)  # 200 ms
    c.p.worker_finished(rid, "completed", c.now)
    c.pump()
    item_id = c.events[-1]["response"]["output"][0]["id"]
    past = c.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 500,
        }
    )
    assert past[0]["error"]["param"] == "audio_end_ms"
    out = c.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 120,
        }
    )
    assert out[0] == {**out[0], "type": "conversation.item.truncated", "audio_end_ms": 120}
    got = c.send({"type": "conversation.item.retrieve", "item_id": item_id})[0]["item"]
    assert len(base64.b64decode(got["content"][0]["audio"])) == 120 * BYTES_PER_MS
    assert got["content"][0].get("transcript") is None


def test_idle_timeout_triggers_a_response() -> None:
    c = Client()
    c.send(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}
                }
            },
        }
    )
    c.append(speech(300) + silence(600))
    rid = c.respond().response_id
    c.p.worker_finished(rid, "completed", c.now)
    c.pump()
    deadline = c.p.next_deadline()
    assert deadline is not None and deadline == pytest.approx(c.now + 5.0)
    c.p.check_timeouts(deadline)
    out = c.pump()
    assert c.types(out)[0] == "input_audio_buffer.timeout_triggered"
    assert "response.created" in c.types(out)


def test_worker_failure_ends_the_response_and_the_session() -> None:
    c = Client(turn_detection=None)
    run_response(c, deltas=1)
    c.p.worker_failed("worker_lost", "the worker is gone")
    out = c.pump()
    assert c.types(out) == [*RESPONSE_END, "error"]
    assert out[-2]["response"]["status"] == "failed"
    assert out[-1]["error"]["code"] == "worker_lost"
    assert c.p.close_expected() and c.p.close_code == 1011


def test_no_slot_closes_with_try_again() -> None:
    c = Client()
    c.p.worker_failed("resource_exhausted", "no worker slot is free")
    assert c.pump()[-1]["error"]["code"] == "resource_exhausted"
    assert c.p.close_code == 1013


def test_disconnect_of_a_plain_session_stops_the_worker() -> None:
    c = Client(turn_detection=None)
    run_response(c, deltas=0)
    c.p.connection_lost(c.now)
    c.pump()
    assert c.p.close_expected()
    assert c.cmds[-2:] == [
        Cancel(c.respond().response_id, "client_cancelled"),
        Stop("disconnected"),
    ]


# ----------------------------------------------------------------------- duplex


def test_duplex_events_carry_a_monotonic_seq_and_capabilities() -> None:
    c = Client(duplex=True)
    created = c.events[0]
    assert created["server_event_seq"] == 1
    assert created["session"]["capabilities"] == {
        "supports_barge_in": True,
        "supports_playback_ack": True,
        "supports_session_resume": True,
    }
    assert created["session"]["resume_token"]
    c.send({"type": "session.heartbeat"})
    run_response(c, deltas=2)
    seqs = [e["server_event_seq"] for e in c.events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert c.events[1]["type"] == "session.heartbeat_ack"


def test_duplex_resume_replays_missed_events_exactly_once_in_order() -> None:
    c = Client(duplex=True, turn_detection=None)
    rid = run_response(c, deltas=2)
    seen = c.events[-1]["server_event_seq"]
    c.p.connection_lost(c.now)
    assert c.p.state is State.DETACHED and not c.p.close_expected()
    for _ in range(3):
        c.p.worker_audio(rid, speech(40), None, 1.0)
    c.p.worker_finished(rid, "completed", c.now)
    missed = [json.loads(f) for f in c.p.data_to_send()]
    token = c.p.resume_token
    assert token
    assert not c.p.resume("wrong-token", seen)
    assert not c.p.resume(token, seen + 999)
    assert c.p.resume(token, seen)
    out = c.pump()
    assert out[0]["type"] == "session.resumed" and out[0]["replayed"] == len(missed)
    assert out[1:] == missed
    assert [e["server_event_seq"] for e in out[1:]] == list(range(seen + 1, seen + 1 + len(missed)))
    assert out[-1]["type"] == "response.done"


def test_duplex_resume_from_an_evicted_seq_requires_resync() -> None:
    c = RealtimeProtocol(
        "s", RealtimeOptions(model="m", duplex=True, replay_events=4), ScriptedVAD, 0.0
    )
    for _ in range(10):
        c.receive_text(json.dumps({"type": "session.heartbeat"}), 0.0)
    c.connection_lost(0.0)
    assert not c.resume(c.resume_token or "", 2)
    assert c.resume(c.resume_token or "", 7)


def test_duplex_playback_ack_truncates_on_barge_in() -> None:
    c = Client(duplex=True)
    c.append(speech(300) + silence(600))
    rid = c.respond().response_id
    for _ in range(10):
        c.p.worker_audio(rid, speech(40), "x", 1.0)
    c.pump()
    ack = c.send({"type": "playback.ack", "played_ms": 160})
    assert ack[0]["type"] == "playback.acknowledged" and ack[0]["response_id"] == rid
    c.append(speech(100))
    c.p.worker_finished(rid, "cancelled", c.now)
    out = c.pump()
    assert c.types(out)[-2:] == ["response.done", "conversation.item.truncated"]
    assert out[-1]["audio_end_ms"] == 160


def test_duplex_close() -> None:
    c = Client(duplex=True)
    out = c.send({"type": "session.close", "reason": "bye"})
    assert c.types(out) == ["session.closed"]
    assert out[0]["reason"] == "bye"
    assert c.cmds[-1] == Stop("bye") and c.p.close_code == 1000


def test_resume_event_without_a_detached_session_asks_for_resync() -> None:
    c = Client(duplex=True)
    out = c.send(
        {
            "type": "session.resume",
            "session_id": "sess_x",
            "resume_token": "t",
            "last_received_server_event_seq": 3,
        }
    )
    assert c.types(out) == ["session.resync_required"]


# ------------------------------------------------------------------ issue 9: hostile JSON


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
    p = RealtimeProtocol(
        "sess_t", RealtimeOptions(model="reference/voice", max_session_s=60.0), ScriptedVAD, 10.0
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
