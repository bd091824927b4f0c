"""Sans-I/O snapshot and restore of a duplex realtime session (``realtime/session_snapshot.py``):
a machine restored on "another replica" from a snapshot, the logged frames and the stored
audio behaves as the original would have: the same conversation, the response in flight
going on, the numbering continuing, the missed events replayed once and in order."""

from __future__ import annotations

import base64
import json
from dataclasses import fields
from typing import Any

from models.realtime_state import ResponseState, VoiceSessionSnapshot
from realtime.audio_protocol import Respond, State, Stop, VoiceSessionOptions, VoiceSessionProtocol
from realtime.responses import ResponseRun
from realtime.session_snapshot import AudioDiff, RelayPosition, audio_parts, restore, snapshot
from tests.unit.realtime_client import SDK, Client, ScriptedVAD, run_response, speech

WALL = 1_800_000_000.0  # epoch seconds at monotonic Client.now


def _transfer(
    c: Client, log: list[tuple[int, str]], *, now: float, wall: float
) -> VoiceSessionProtocol:
    """Snapshot ``c``'s machine, through JSON, and restore it at another clock."""
    snap = snapshot(c.p, "owner-1", RelayPosition(True, True, "5-0"), c.now, WALL)
    wire = snap.model_dump_json()
    audio = {k: bytes(v) for k, v in audio_parts(c.p).items()}
    back = VoiceSessionSnapshot.model_validate_json(wire)
    options = VoiceSessionOptions(model=back.model, duplex=True)
    return restore(back, audio, log, options, ScriptedVAD, now, wall)


def _events(frames: list[str]) -> list[dict[str, Any]]:
    out = [json.loads(f) for f in frames]
    for event in out:
        if event["type"] in SDK:
            SDK[event["type"]].model_validate(event)
    return out


def test_a_restored_session_replays_the_log_and_goes_on_with_the_response() -> None:
    c = Client(duplex=True, turn_detection=None)
    c.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_audio", "audio": base64.b64encode(speech(80)).decode()}
                ],
            },
        }
    )
    rid = run_response(c, deltas=2)
    log = c.p.journal()  # what the serving replica stored, all of it
    assert [seq for seq, _ in log] == [e["server_event_seq"] for e in c.events]
    seen = c.events[-3]["server_event_seq"]  # the client missed the last two events
    token = c.p.resume_token
    assert token

    # "replica B", 7 s later on another clock
    b = _transfer(c, [(s, f) for s, f in log if s > seen], now=50.0, wall=WALL + 7)
    assert b.data_to_send() == [] and b.commands() == []
    assert b.id == c.p.id and b.resume_token == token and b.last_seq == c.p.last_seq
    assert b.conversation.ids() == c.p.conversation.ids()
    assert b.conversation.latest_user_turn() == c.p.conversation.latest_user_turn()
    assert not b.resume("wrong", seen)
    assert b.resume(token, seen)
    out = _events(b.data_to_send())
    assert out[0]["type"] == "session.resumed" and out[0]["replayed"] == 2
    assert out[1:] == c.events[-2:]

    b.worker_audio(rid, speech(40), "more", 2.0)  # the response goes on
    b.worker_finished(rid, "completed", 51.0)
    live = _events(b.data_to_send())
    seqs = [e["server_event_seq"] for e in live]
    assert seqs == list(range(c.p.last_seq + 1, c.p.last_seq + 1 + len(live)))
    assert live[0]["type"] == "response.output_audio.delta"
    done = live[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "completed"
    assert done["response"]["usage"]["output_tokens"] == 2  # 3 × 40 ms of audio in all
    assert done["response"]["output"][0]["content"][0]["transcript"] == "w0 w1 more"
    assert [seq for seq, _ in b.journal()] == seqs  # the new events are for the store

    # the assistant's audio is whole in the conversation: 3 deltas of 40 ms
    b.receive_text(
        json.dumps(
            {"type": "conversation.item.retrieve", "item_id": done["response"]["output"][0]["id"]}
        ),
        52.0,
    )
    retrieved = _events(b.data_to_send())[0]
    assert len(base64.b64decode(retrieved["item"]["content"][0]["audio"])) == len(speech(120))


def test_clocks_cross_processes_as_wall_time() -> None:
    c = Client(duplex=True, turn_detection=None)
    c.p.options.cancel_grace_s = 2.0
    rid = run_response(c, deltas=1)
    c.send({"type": "response.cancel"})  # at c.now = 100: confirmed by 102 or forced
    b = _transfer(c, [], now=10.0, wall=WALL + 0.5)  # half a second later elsewhere
    assert b.active is not None and b.active.id == rid and b.active.muted
    deadline = b.next_deadline()
    assert deadline is not None and abs(deadline - 11.5) < 1e-6
    b.worker_audio(rid, speech(40), None, 1.0)  # muted: dropped
    b.check_timeouts(11.6)
    out = _events(b.data_to_send())
    assert out[-1]["type"] == "response.done" and out[-1]["response"]["status"] == "cancelled"
    assert not any(e["type"] == "response.output_audio.delta" for e in out)


def test_the_response_in_flight_is_stored_field_for_field() -> None:
    # snapshot/restore copy a ResponseRun by its field names: the stored model has them all
    assert [f.name for f in fields(ResponseRun)] == list(ResponseState.model_fields)
    c = Client(duplex=True, turn_detection=None)
    rid = run_response(c, deltas=1)
    b = _transfer(c, [], now=c.now, wall=WALL)
    assert c.p.active is not None and b.active == c.p.active and b.active.id == rid


def test_session_config_and_closed_state_survive() -> None:
    c = Client(duplex=True, turn_detection=None)
    c.send({"type": "session.update", "session": {"instructions": "be brief"}})
    b = _transfer(c, [], now=0.0, wall=WALL)
    assert b.session == c.p.session and b.session.instructions == "be brief"
    assert b.vad_active is False
    b.receive_text(json.dumps({"type": "response.create"}), 1.0)
    respond = next(cmd for cmd in b.commands() if isinstance(cmd, Respond))
    assert respond.instructions == "be brief"
    c.p.close("bye", c.now)
    closed = _transfer(c, [], now=0.0, wall=WALL)
    assert closed.state is State.CLOSED and not closed.resume(c.p.resume_token or "", 1)
    assert Stop("bye") in c.p.commands()


def test_audio_diff_appends_while_streaming_and_rewrites_after_a_truncation() -> None:
    c = Client(duplex=True, turn_detection=None)
    rid = run_response(c, deltas=2)
    diff = AudioDiff()
    parts = audio_parts(c.p)
    first = diff.writes(parts)
    assert [(w.op, len(w.data)) for w in first] == [("set", len(speech(80)))]
    diff.written(first, parts)
    assert diff.writes(parts) == []
    c.p.worker_audio(rid, speech(40), None, 1.0)
    grow = diff.writes(audio_parts(c.p))
    assert [(w.op, w.data) for w in grow] == [("append", speech(40))]
    diff.written(grow, audio_parts(c.p))
    c.p.worker_finished(rid, "completed", c.now)
    item_id = c.p.conversation.ids()[-1]
    c.send(
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 40,
        }
    )
    cut = diff.writes(audio_parts(c.p))
    assert [(w.op, len(w.data)) for w in cut] == [("set", len(speech(40)))]
    diff.written(cut, audio_parts(c.p))
    c.send({"type": "conversation.item.delete", "item_id": item_id})
    gone = diff.writes(audio_parts(c.p))
    assert [(w.op, w.part) for w in gone] == [("delete", (item_id, 0))]
