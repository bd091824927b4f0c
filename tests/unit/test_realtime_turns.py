"""Sans-I/O tests of ``WS /v1/realtime`` turns and responses: the input buffer, server VAD
and barge-in, the response event sequence, cancel, conversation items, the worker's
failure and the socket's end. Events in, events out (``realtime_client.Client``)."""

from __future__ import annotations

import base64

import pytest

from realtime.audio_protocol import Cancel, Stop
from realtime.input_audio import BYTES_PER_MS
from tests.unit.realtime_client import (
    RESPONSE_END,
    RESPONSE_START,
    Client,
    run_response,
    silence,
    speech,
)


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
    c = Client(turn_detection={"type": "server_vad", "interrupt_response": False})
    c.append(speech(300) + silence(600))
    rid = c.respond().response_id
    c.append(speech(200))
    assert not any(isinstance(x, Cancel) for x in c.cmds)
    c.p.worker_audio(rid, speech(40), None, 1.0)
    assert c.types(c.pump()) == ["response.output_audio.delta"]


def test_create_response_false_only_commits() -> None:
    c = Client(turn_detection={"type": "server_vad", "create_response": False})
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
    c = Client(turn_detection={"type": "server_vad", "idle_timeout_ms": 5000})
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
