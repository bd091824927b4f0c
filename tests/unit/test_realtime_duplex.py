"""Sans-I/O tests of the full-duplex extension of ``WS /v1/realtime`` (``/v1/duplex``):
event sequence numbers, ``session.resume`` replay, playback acknowledgements, close.
Events in, events out (``realtime_client.Client``)."""

from __future__ import annotations

import json

from realtime import audio_protocol as rt
from tests.unit.realtime_client import Client, ScriptedVAD, run_response, silence, speech


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
    assert c.p.state is rt.State.DETACHED and not c.p.close_expected()
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
    c = rt.VoiceSessionProtocol(
        "s", rt.VoiceSessionOptions(model="m", duplex=True, replay_events=4), ScriptedVAD, 0.0
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
    assert c.cmds[-1] == rt.Stop("bye") and c.p.close_code == 1000


RESUME = {
    "type": "session.resume",
    "session_id": "sess_x",
    "resume_token": "t",
    "last_received_server_event_seq": 3,
}


def test_a_first_resume_event_is_handed_to_the_shell() -> None:
    """The socket's first event names another session: nothing is said until the shell
    looked it up; with none to resume, the shell's ``resume_refused`` asks for a resync."""
    c = Client(duplex=True)
    assert c.send(RESUME) == [] and c.cmds == []
    assert c.p.resume_requested() == rt.ResumeRequested("sess_x", "t", 3)
    assert c.p.resume_requested() is None  # handed over once
    c.p.resume_refused("sess_x")
    out = c.pump()
    assert c.types(out) == ["session.resync_required"] and out[0]["session_id"] == "sess_x"
    assert c.p.state is rt.State.OPEN  # the fresh session goes on


def test_a_later_resume_event_asks_for_resync_at_once() -> None:
    c = Client(duplex=True)
    c.send({"type": "session.heartbeat"})
    assert c.types(c.send(RESUME)) == ["session.resync_required"]
    assert c.p.resume_requested() is None


def test_a_malformed_first_resume_is_a_client_error_not_a_request() -> None:
    c = Client(duplex=True)
    out = c.send({**RESUME, "last_received_server_event_seq": -1})
    assert c.types(out) == ["error"]
    assert out[0]["error"]["param"] == "last_received_server_event_seq"
    assert c.p.resume_requested() is None
    assert c.types(c.send(RESUME)) == ["session.resync_required"]  # no longer the first


def test_a_session_attached_by_resume_asks_for_no_other() -> None:
    c = Client(duplex=True)
    c.p.connection_lost(c.now)
    assert c.p.resume(c.p.resume_token or "", 1)
    c.pump()
    assert c.types(c.send(RESUME)) == ["session.resync_required"]
    assert c.p.resume_requested() is None


# ------------------------------------------------------------------ issue 9: hostile JSON
