"""The ``WS /v1/realtime/video`` session state machine, driven without a socket: chunk
arithmetic, a whole session, liveness, stop, the worker's and the client's misuse,
failures and disconnects."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from models.realtime_video_chunks import chunks_for_frames, frames_for_chunks, frames_in_chunk
from models.session_bus import ChunkOutput
from realtime.video_protocol import (
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_TRY_AGAIN,
    ProtocolError,
    StartRequested,
    State,
    StopRequested,
    WorldSessionProtocol,
)
from tests.unit.world_session_client import (
    INIT,
    error_event,
    interaction_json,
    new_session,
    one_event,
    send_media,
    start_json,
    streaming,
    texts,
    timed_out,
)

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
    p = new_session()
    p.receive_text(start_json(num_frames=189, extra_params={"camera_action_script": script}), 0.5)
    assert p.state is State.STARTING
    assert p.data_to_send() == []  # nothing until a worker admits the session
    [command] = p.events_received()
    assert isinstance(command, StartRequested) and not command.system
    assert command.config.model_dump() == {
        "width": 832, "height": 480, "fps": 16.0, "num_frames": 189, "chunks": 16,
        "num_inference_steps": 4,  # StartRules' default (no model named: no spec)
    }  # fmt: skip
    assert command.start.extra_params.camera_action_script == script

    p.started(now=1.0)
    start = one_event(p)
    assert start == {
        "type": "video.start", "request_id": "video_stream-1", "format": "m4s",
        "config": {
            "width": 832, "height": 480, "fps": 16.0, "num_frames": 189, "chunks": 16,
            "num_inference_steps": 4,
        },
        # the resume extension
        "session_id": "video_stream-1", "resume_token": p.resume_token,
    }  # fmt: skip
    assert len(p.resume_token) >= 32
    assert p.state is State.STREAMING

    binaries: list[bytes] = []
    for index in range(16):
        send_media(p, index, now=2.0 + index)
        metadata, data = p.data_to_send()  # exactly one text frame, then one binary
        assert isinstance(metadata, str) and isinstance(data, bytes)
        meta = texts([metadata])[0]
        assert meta["type"] == "video.chunk_metadata" and meta["kind"] == "media"
        assert meta["generation_chunk_index"] == meta["transport_chunk_index"] == index
        assert meta["num_frames"] == frames_in_chunk(index)
        assert meta["byte_length"] == len(data)
        assert meta["produced_at"] == 100.0 + index
        binaries.append(data)
    assert binaries[0][4:8] == b"ftyp"  # the init segment rides in the first binary frame
    assert sum(frames_in_chunk(i) for i in range(16)) == 189

    p.chunk(ChunkOutput(kind="trailer", produced_at=120.0), b"mfra-bytes", now=20.0)
    metadata, data = p.data_to_send()
    assert isinstance(metadata, str) and data == b"mfra-bytes"
    meta = texts([metadata])[0]
    assert meta["kind"] == "trailer" and meta["generation_chunk_index"] is None
    assert (meta["transport_chunk_index"], meta["num_frames"]) == (16, 0)

    p.finished(stopped=False)
    assert one_event(p) == {
        "type": "session.done", "request_id": "video_stream-1", "chunks": 16, "stopped": False,
    }  # fmt: skip
    assert p.state is State.DONE
    assert p.close_expected() and p.close_code == CLOSE_NORMAL
    assert p.next_deadline() is None


def test_persisted_session_reports_its_artifact() -> None:
    p = streaming(start=start_json(num_frames=9, extra_params={"persist": True}))
    send_media(p, 0)
    p.data_to_send()
    p.finished(stopped=False, artifact_id="video_abc")
    assert one_event(p)["artifact_id"] == "video_abc"


def test_vllm_omni_client_fields_are_accepted_and_resolved() -> None:
    """The plain vLLM-Omni client sends size/seconds and sampler knobs at the top level."""
    start = start_json(
        width=None, height=None, num_frames=None, image_reference=None, extra_params=None,
        size="640x384", seconds=2, num_inference_steps=4, guidance_scale=1.0,
        sampling_params={"quality": "high"}, lora=None, some_future_field=1,
    )  # fmt: skip
    p = new_session()
    p.receive_text(start, 0.0)
    [command] = p.events_received()
    assert isinstance(command, StartRequested)
    # 2 s at 16 fps = 32 frames → 2 whole chunks → 21 frames
    assert (command.config.width, command.config.height) == (640, 384)
    assert (command.config.chunks, command.config.num_frames) == (2, 21)
    assert command.start.sampling_params == {"quality": "high"}
    assert command.start.model_extra == {"some_future_field": 1}


# ------------------------------------------------------------------ liveness


def test_stall_timeout_stops_the_worker_and_closes() -> None:
    p = streaming(now=0.0, stall_timeout=60.0)
    assert p.next_deadline() == 60.0
    error = timed_out(p, 60.0, "stalled")
    assert (error["code"], error["request_id"]) == ("stalled", "video_stream-1")
    assert p.state is State.FAILED and p.close_code == CLOSE_INTERNAL


def test_ping_and_progress_refresh_the_stall_clock() -> None:
    p = streaming(now=0.0)
    p.receive_text('{"type": "session.ping"}', 50.0)
    assert one_event(p) == {"type": "session.pong"}
    p.check_timeouts(100.0)
    assert p.state is State.STREAMING
    send_media(p, 0, now=105.0)  # a chunk is progress too
    p.data_to_send()
    p.check_timeouts(160.0)
    assert p.state is State.STREAMING and p.next_deadline() == 165.0
    p.check_timeouts(165.0)
    assert error_event(p)["code"] == "stalled"


# ------------------------------------------------------------------ stop


def test_stop_during_streaming() -> None:
    p = streaming()
    send_media(p, 0)
    assert len(p.data_to_send()) == 2
    send_media(p, 1)  # produced, not yet taken by the sender when the stop arrives
    p.receive_text('{"type": "session.stop"}', 5.0)
    [command] = p.events_received()
    assert command == StopRequested("client") and command.system
    assert p.state is State.STOPPING
    assert p.data_to_send() == []  # data-class pair dropped by the interrupt
    send_media(p, 2)  # the step in flight: checked, not sent
    assert p.data_to_send() == []
    p.receive_text('{"type": "session.stop"}', 6.0)  # idempotent
    assert p.events_received() == []
    p.receive_text(interaction_json(), 6.5)
    assert error_event(p)["code"] == "invalid_state"
    p.finished(stopped=True)
    assert one_event(p) == {
        "type": "session.done", "request_id": "video_stream-1", "chunks": 1, "stopped": True,
    }  # fmt: skip
    assert p.close_code == CLOSE_NORMAL


def test_stop_while_starting_ends_without_video() -> None:
    p = new_session()
    p.receive_text(start_json(), 0.0)
    p.receive_text('{"type": "session.stop"}', 1.0)
    assert [type(c) for c in p.events_received()] == [StartRequested, StopRequested]
    p.finished(stopped=True)
    done = one_event(p)
    assert (done["type"], done["chunks"], done["stopped"]) == ("session.done", 0, True)


# ------------------------------------------------------------------ worker misuse


def test_chunk_contiguity_is_enforced() -> None:
    p = streaming()
    send_media(p, 0)
    with pytest.raises(ProtocolError, match="chunk 2, not 1"):
        send_media(p, 2)


def _no_init_segment(p: WorldSessionProtocol) -> None:
    p.chunk(
        ChunkOutput(kind="media", produced_at=0, generation_chunk_index=0, num_frames=9),
        b"moof",
        now=0,
    )


def _finished_early(p: WorldSessionProtocol) -> None:
    send_media(p, 0)
    p.finished(stopped=False)  # 1 of 3 chunks


def _too_many_chunks(p: WorldSessionProtocol) -> None:
    for index in range(4):
        send_media(p, index)


def _media_after_trailer(p: WorldSessionProtocol) -> None:
    send_media(p, 0)
    p.chunk(ChunkOutput(kind="trailer", produced_at=0), b"t", now=0)
    send_media(p, 1)


def _indexed_trailer(p: WorldSessionProtocol) -> None:
    p.chunk(ChunkOutput(kind="trailer", produced_at=0, generation_chunk_index=0), INIT, now=0)


def _empty_chunk(p: WorldSessionProtocol) -> None:
    p.chunk(
        ChunkOutput(kind="media", produced_at=0, generation_chunk_index=0, num_frames=9), b"", now=0
    )


def _started_twice(p: WorldSessionProtocol) -> None:
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
def test_illegal_worker_calls_raise(misuse: Callable[[WorldSessionProtocol], None]) -> None:
    with pytest.raises(ProtocolError):
        misuse(streaming())


def test_worker_calls_before_admission_raise() -> None:
    p = new_session()
    with pytest.raises(ProtocolError):
        p.failed("internal_error", "boom")
    p.receive_text(start_json(), 0.0)
    with pytest.raises(ProtocolError):
        send_media(p, 0)
    with pytest.raises(ProtocolError):
        p.finished(stopped=False)


# ------------------------------------------------------------------ client misuse, failures


def test_binary_from_the_client_is_an_error() -> None:
    p = streaming()
    p.receive_binary(b"\x00" * 10, 1.0)
    assert error_event(p)["code"] == "binary_not_supported"
    assert p.state is State.STREAMING and not p.close_expected()


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ('{"type": "session.resume"}', "unknown_event"),
        ('{"no_type": 1}', "unknown_event"),
        ("not json", "invalid_json"),
        (start_json(), "invalid_state"),
        ('{"type": "session.interaction"}', "invalid_interaction"),
    ],
)
def test_bad_control_message_is_an_error_and_the_session_stays_open(
    message: str, code: str
) -> None:
    p = streaming()
    p.receive_text(message, 1.0)
    assert error_event(p)["code"] == code
    assert p.state is State.STREAMING and not p.close_expected()
    assert p.events_received() == []


def test_control_messages_have_their_own_cap() -> None:
    p = streaming(max_control_bytes=1024)
    p.receive_text(interaction_json(**{"pad": "x" * 2000}), 1.0)
    assert error_event(p)["code"] == "message_too_large"
    assert p.state is State.STREAMING


@pytest.mark.parametrize(
    ("code", "close"),
    [("resource_exhausted", CLOSE_TRY_AGAIN), ("worker_lost", CLOSE_INTERNAL)],
)
def test_failure_sends_error_then_closes(code: str, close: int) -> None:
    p = new_session()
    p.receive_text(start_json(), 0.0)
    p.receive_text('{"type": "session.ping"}', 1.0)  # held reply still goes out, first
    p.failed(code, "no worker slot")
    pong, error = texts(p.data_to_send())
    assert pong["type"] == "session.pong"
    assert (error["code"], error["request_id"]) == (code, "video_stream-1")
    assert p.state is State.FAILED and p.close_code == close


def test_failure_drops_undelivered_chunks() -> None:
    p = streaming()
    send_media(p, 0)
    p.failed("worker_lost", "the worker went away")
    assert error_event(p)["code"] == "worker_lost"
    assert p.chunks_sent == 0


def test_disconnect_stops_the_worker_and_later_input_is_ignored() -> None:
    p = streaming()
    send_media(p, 0)
    p.connection_lost()
    assert p.events_received() == [StopRequested("disconnected")]
    assert p.state is State.FAILED and p.data_to_send() == []
    p.receive_text('{"type": "session.ping"}', 2.0)
    send_media(p, 1)
    p.finished(stopped=True)
    p.check_timeouts(1e9)
    assert p.data_to_send() == [] and p.events_received() == []


# ------------------------------------------------------------------ late interactions


def test_an_interaction_after_every_chunk_was_made_is_too_late_at_once() -> None:
    p = streaming()  # 3 chunks
    for index in range(3):
        send_media(p, index)
    p.data_to_send()
    p.receive_text(interaction_json("late"), 1.0)
    assert p.events_received() == []  # nothing for the worker: no chunk is left
    error = error_event(p)
    assert error["code"] == "interaction_too_late" and error["event_id"] == "late"
    assert p.state is State.STREAMING  # the session goes on to its end
    p.finished(stopped=False)
    assert [e["type"] for e in texts(p.data_to_send())] == ["session.done"]


def test_an_interaction_no_chunk_started_is_reported_before_done() -> None:
    p = streaming()
    send_media(p, 0)
    p.receive_text(interaction_json("applied"), 1.0)
    p.receive_text(interaction_json("during-the-last"), 1.1)
    assert len(p.events_received()) == 2  # both went to the worker
    send_media(p, 1, started_event_ids=["applied"], active_event_ids=["applied"])
    send_media(p, 2)
    p.data_to_send()
    p.finished(stopped=False)
    events = texts(p.data_to_send())
    assert [(e["type"], e.get("event_id")) for e in events] == [
        ("error", "during-the-last"),
        ("session.done", None),
    ]
    assert events[0]["code"] == "interaction_too_late"


def test_a_stopped_session_reports_no_late_interaction() -> None:
    p = streaming()
    send_media(p, 0)
    p.receive_text(interaction_json("pending"), 1.0)
    p.receive_text('{"type": "session.stop"}', 1.1)
    p.data_to_send()
    p.finished(stopped=True)
    assert [e["type"] for e in texts(p.data_to_send())] == ["session.done"]


def test_a_checkpoint_a_model_cannot_restore_fails_the_takeover_plainly() -> None:
    """A checkpoint stored for a session whose model this worker serves without
    ``SupportsSnapshot`` (the registry changed between the two workers): the takeover
    fails with a message naming both, not as if nothing had been stored."""
    from types import SimpleNamespace

    from workers.pipelines.base import WorldConfig
    from workers.sessions.world_checkpoint import SessionCheckpoint

    stored = SimpleNamespace(meta=SimpleNamespace(), state=b"", init=b"")
    store = SimpleNamespace(load=lambda session, attempt: stored)
    slot = SimpleNamespace(id="rtv_1", attempt=2)
    no_snapshots = SimpleNamespace()  # a world pipeline without snapshot/restore
    checkpoint = SessionCheckpoint(store, slot, None, no_snapshots)  # type: ignore[arg-type]
    config = WorldConfig(prompt="p", width=64, height=64, num_frames=9, fps=8.0, seed=0)
    with pytest.raises(RuntimeError, match=r"checkpoint of rtv_1 is stored.*cannot restore"):
        checkpoint.resume(config)
