"""``WS /v1/realtime/video`` end to end: a websockets client, the API process, Redis
Streams, and a realtime worker process with two session slots running reference/world."""

from __future__ import annotations

import io
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest
import redis
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from cli.embedded import EmbeddedS3
from storage.constants import session_in_key, session_state_key
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START = {
    "type": "session.start",
    "model": "reference/world",
    "prompt": "a red ball at sunset",
    "width": 64,
    "height": 64,
    "num_frames": 33,
    "fps": 16,
    "seed": 3,
}
# 80 chunks at 256x256: long enough (seconds) to hold a slot while the test acts
LONG = {**START, "width": 256, "height": 256, "num_frames": 957}


@pytest.fixture(scope="module")
def rstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    work = module_dir
    env = {
        "OMNIQ_REALTIME__SLOTS": "2",
        "OMNIQ_REALTIME__ADMISSION_TIMEOUT_S": "3",
        "OMNIQ_REALTIME__START_TIMEOUT_S": "2",
        "OMNIQ_REALTIME__LOST_AFTER_S": "4",
        "OMNIQ_REALTIME__KEEPALIVE_S": "0.5",
    }
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.start(workers=0, realtime_workers=1)
        yield st


def _ws(st: Stack) -> ClientConnection:
    return connect(
        st.url.replace("http://", "ws://") + "/v1/realtime/video", max_size=16 * 1024 * 1024
    )


def _json(ws: ClientConnection, timeout: float = 30) -> dict[str, Any]:
    message = ws.recv(timeout=timeout)
    assert isinstance(message, str), "expected a JSON text frame"
    return dict(json.loads(message))


def _until(ws: ClientConnection, kind: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = ws.recv(timeout=timeout)
        if isinstance(message, str) and json.loads(message)["type"] == kind:
            return dict(json.loads(message))
    raise AssertionError(f"no {kind}")


def test_full_session_streams_a_playable_fmp4(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        ws.send(json.dumps(START))
        start = _json(ws)
        assert start["type"] == "video.start"
        assert start["config"] == {
            "width": 64,
            "height": 64,
            "fps": 16.0,
            "num_frames": 33,
            "chunks": 3,
            "num_inference_steps": 4,  # reference/world's default_steps
        }
        blobs, metas = [], []
        while True:
            meta = _json(ws)
            if meta["type"] == "session.done":
                done = meta
                break
            assert meta["type"] == "video.chunk_metadata"
            blob = ws.recv(timeout=30)
            assert isinstance(blob, bytes) and len(blob) == meta["byte_length"]
            arrived = time.time()
            assert 0 <= arrived - meta["produced_at"] < 5
            metas.append(meta)
            blobs.append(blob)
    media = [m for m in metas if m["kind"] == "media"]
    assert [m["generation_chunk_index"] for m in media] == [0, 1, 2]
    assert [m["num_frames"] for m in media] == [9, 12, 12]
    assert [m["transport_chunk_index"] for m in metas] == list(range(len(metas)))
    assert done == {**done, "chunks": 3, "stopped": False, "request_id": start["request_id"]}
    assert blobs[0][4:8] == b"ftyp"
    with av.open(io.BytesIO(b"".join(blobs))) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 33 and (frames[0].width, frames[0].height) == (64, 64)


def _png_data_url(color: tuple[int, int, int]) -> str:
    import base64

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (96, 48), color).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_image_reference_is_the_first_frame(rstack: Stack) -> None:
    color = (200, 40, 30)
    with _ws(rstack) as ws:
        ws.send(
            json.dumps(
                {**START, "num_frames": 9, "image_reference": {"image_url": _png_data_url(color)}}
            )
        )
        assert _json(ws)["type"] == "video.start"
        blobs = []
        while True:
            meta = _json(ws)
            if meta["type"] == "session.done":
                break
            blobs.append(ws.recv(timeout=30))
    with av.open(io.BytesIO(b"".join(blobs))) as container:
        first = next(container.decode(video=0)).to_ndarray(format="rgb24")
    mean = first.reshape(-1, 3).mean(axis=0)
    assert all(abs(m - c) < 25 for m, c in zip(mean, color, strict=True)), mean


def test_a_broken_image_reference_is_refused(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        ws.send(
            json.dumps(
                {**START, "image_reference": {"image_url": "data:image/png;base64,aGVsbG8="}}
            )
        )
        error = _until(ws, "error")
        assert error["code"] == "invalid_image_reference"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_interaction_ping_and_conflicts(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        ws.send(json.dumps({**START, "num_frames": 93}))  # 8 chunks
        assert _json(ws)["type"] == "video.start"
        ws.send(json.dumps({"type": "session.ping"}))
        assert _until(ws, "session.pong")
        change = {
            "type": "session.interaction",
            "interaction": {
                "event_id": "e1",
                "event": {"prompt": "a blue forest at night"},
                "transition_chunks": 2,
            },
        }
        ws.send(json.dumps(change))
        queued = _until(ws, "session.interaction.queued")
        assert queued["event_id"] == "e1"
        ws.send(json.dumps(change))
        error = _until(ws, "error")
        assert error["code"] == "event_id_conflict" and error["event_id"] == "e1"
        started_ids: list[str] = []
        while True:
            msg = _json(ws)
            if msg["type"] == "session.done":
                break
            if msg["type"] == "video.chunk_metadata":
                started_ids += msg["started_event_ids"]
                ws.recv(timeout=30)
        assert started_ids == ["e1"]
        assert msg["chunks"] == 8


def test_stop_ends_with_stopped_and_frees_the_slot(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        ws.send(json.dumps(LONG))
        assert _json(ws)["type"] == "video.start"
        _until(ws, "video.chunk_metadata")
        ws.send(json.dumps({"type": "session.stop"}))
        done = _until(ws, "session.done")
        assert done["stopped"] is True and done["chunks"] < 80
    _two_slots_then_exhausted(rstack)


@pytest.mark.parametrize("code", [1000, 4000])
def test_a_cleanly_closed_session_cannot_be_resumed(rstack: Stack, code: int) -> None:
    """A close frame with a status code ends the session at once (no grace period,
    unlike a dropped socket): ``session.resume`` right after is answered ``session_not_found``,
    close 1008, and no chunk or ``session.done`` of the old session.

    The close handshake completes in the server's WebSocket layer before the app has
    handled it, so the resume waits until the session's record is gone (what the server's
    handling of the close does); a resume racing the close may still find the session
    (docs/protocols/realtime-video.md)."""
    with _ws(rstack) as ws:
        ws.send(json.dumps(LONG))
        start = _json(ws)
        assert start["type"] == "video.start" and start["resume_token"]
        for _ in range(2):
            assert _until(ws, "video.chunk_metadata")["kind"] == "media"
            assert isinstance(ws.recv(timeout=30), bytes)
        ws.close(code)  # a close frame, then the server's
    holder = session_state_key(start["session_id"], "holder")
    with redis.Redis.from_url(rstack.redis_url) as client:
        deadline = time.monotonic() + 10
        while client.exists(holder):
            assert time.monotonic() < deadline, "the closed session's record stayed"
            time.sleep(0.02)
    resume = {
        "type": "session.resume",
        "session_id": start["session_id"],
        "resume_token": start["resume_token"],
        "last_generation_chunk_index": 1,
    }
    with _ws(rstack) as again:
        again.send(json.dumps(resume))
        reply = _json(again)
        assert reply["type"] == "error" and reply["code"] == "session_not_found", reply
        with pytest.raises(ConnectionClosed):
            again.recv(timeout=10)
        assert again.close_code == 1008


def _two_slots_then_exhausted(rstack: Stack) -> None:
    long = LONG
    with _ws(rstack) as a, _ws(rstack) as b:
        for ws in (a, b):
            ws.send(json.dumps(long))
            assert _json(ws)["type"] == "video.start"
        with _ws(rstack) as c:
            c.send(json.dumps(long))
            error = _until(c, "error", timeout=20)
            assert error["code"] == "resource_exhausted"
            with pytest.raises(ConnectionClosed):
                c.recv(timeout=10)
        # a disconnect frees its slot within a step: a new session gets in
        a.close()
        with _ws(rstack) as d:
            d.send(json.dumps(long))
            assert _json(d, timeout=20)["type"] == "video.start"


def test_start_timeout_and_bad_start(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        error = _json(ws, timeout=10)
        assert error["type"] == "error" and error["code"] == "start_timeout"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
    with _ws(rstack) as ws:
        ws.send(json.dumps({**START, "width": 60}))
        assert _json(ws)["code"] == "invalid_size"


def test_worker_dying_mid_session_ends_it_with_an_error(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        ws.send(json.dumps(LONG))
        assert _json(ws)["type"] == "video.start"
        _until(ws, "video.chunk_metadata")
        rstack.stop_process("rt0", signal.SIGKILL)
        try:
            error = _until(ws, "error", timeout=20)
            assert error["code"] == "worker_lost"
            with pytest.raises(ConnectionClosed):
                while True:
                    ws.recv(timeout=10)
        finally:
            rstack._spawn("rt0", "worker", "--realtime", "--name", "rt0")
            rstack.wait_workers(1)  # the new rt0 logged "ready." since its spawn


def test_an_unexpected_worker_error_ends_the_session_with_a_fixed_message(rstack: Stack) -> None:
    """A bare ValueError on the worker (as numpy, PIL or PyAV raise) after the first chunk:
    the client gets that chunk, then ``internal_error`` with a fixed message, never the
    exception's text, and the socket closes."""
    rstack.set_failpoints({"session_chunk:1": "value"})
    try:
        with _ws(rstack) as ws:
            ws.send(json.dumps(START))
            assert _json(ws)["type"] == "video.start"
            assert _until(ws, "video.chunk_metadata")["generation_chunk_index"] == 0
            error = _until(ws, "error")
            assert (error["code"], error["message"]) == ("internal_error", "internal error")
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    finally:
        rstack.set_failpoints({})


def test_persisted_session_becomes_a_video(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        ws.send(json.dumps({**START, "extra_params": {"persist": True}}))
        done = _until(ws, "session.done")
    assert done["stopped"] is False and done["artifact_id"].startswith("video_")
    with rstack.client() as c:
        video = c.get(f"/v1/videos/{done['artifact_id']}").json()
        assert video["status"] == "completed" and video["num_frames"] == 33
        data = c.get(f"/v1/videos/{done['artifact_id']}/content").content
    assert data.find(b"moov") < data.find(b"mdat")  # progressive, not fragmented
    with av.open(io.BytesIO(data)) as container:
        assert len(list(container.decode(video=0))) == 33


def test_stall_timeout_closes_the_session(rstack: Stack, tmp_path: Path) -> None:
    """A second API process on the same bus with a 0.3 s stall timeout; a 1280x720 chunk
    takes several times that to make, so neither the client nor the worker says anything
    for that long."""
    impatient = rstack.sibling(tmp_path, {"OMNIQ_REALTIME__STALL_TIMEOUT_S": "0.3"})
    impatient.start(workers=0)
    try:
        with _ws(impatient) as ws:
            ws.send(json.dumps({**START, "width": 1280, "height": 720, "num_frames": 957}))
            assert _json(ws)["type"] == "video.start"
            error = _until(ws, "error", timeout=30)
            assert error["code"] == "stalled"
            with pytest.raises(ConnectionClosed):
                while True:
                    ws.recv(timeout=10)
        # the worker stops within a step once told, and its slot serves the next session
        with _ws(rstack) as ws:
            ws.send(json.dumps(START))
            assert _json(ws, timeout=30)["type"] == "video.start"
    finally:
        impatient.stop()


# ------------------------------------------------------------------ issue 9


def _session_keys(st: Stack) -> set[bytes]:
    """The command streams of sessions: placing a session creates its stream first."""
    client = redis.Redis.from_url(st.redis_url)
    try:
        return set(client.scan_iter(match=session_in_key("*")))
    finally:
        client.close()


def _closed_with(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=10)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"num_frames": 10**12}, "num_frames"),
        ({"num_frames": 957 + 12}, "num_frames"),  # one chunk past reference/world's 957
        ({"num_frames": None, "seconds": 10**6}, "seconds"),
        ({"num_frames": True}, "num_frames"),
    ],
)
def test_rollout_beyond_max_frames_is_refused_before_placement(
    rstack: Stack, fields: dict[str, Any], param: str
) -> None:
    before = _session_keys(rstack)
    with _ws(rstack) as ws:
        ws.send(json.dumps({k: v for k, v in {**START, **fields}.items() if v is not None}))
        error = _json(ws, timeout=10)
        assert (error["type"], error["code"], error["param"]) == (
            "error",
            "invalid_num_frames",
            param,
        )
        assert _closed_with(ws) == 1008
    # nothing was placed: no new session stream
    assert _session_keys(rstack) - before == set()
    with _ws(rstack) as ws:  # and both slots are free
        ws.send(json.dumps(START))
        assert _json(ws, timeout=20)["type"] == "video.start"


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"seed": 10**100}, "seed"), ({"fps": True}, "fps"), ({"width": 4096}, "width")],
)
def test_huge_numbers_in_session_start_are_param_errors(
    rstack: Stack, fields: dict[str, Any], param: str
) -> None:
    with _ws(rstack) as ws:
        ws.send(json.dumps({**START, **fields}))
        error = _json(ws, timeout=10)
        assert error["type"] == "error" and error["param"] == param
        assert _closed_with(ws) == 1008


def test_hostile_json_is_an_error_and_the_session_goes_on(rstack: Stack) -> None:
    with _ws(rstack) as ws:
        ws.send('{"type": "session.start", "prompt": "\\ud800"}')  # a lone surrogate
        error = _json(ws, timeout=10)
        assert (error["code"], error["param"]) == ("invalid_json", "prompt")
        assert _closed_with(ws) == 1008
    with _ws(rstack) as ws:
        ws.send(json.dumps({**START, "num_frames": 957}))
        assert _json(ws)["type"] == "video.start"
        for hostile in (
            "[" * 100_000,
            '{"type": "session.ping", "n": ' + "9" * 5000 + "}",
            '{"type": "\\ud800"}',
            '{"type": "session.interaction", "interaction": {"event_id": "\\udfff",'
            ' "event": {"prompt": "x"}}}',
        ):
            ws.send(hostile)
            assert _until(ws, "error")["code"] == "invalid_json"
        ws.send(json.dumps({"type": "session.ping"}))
        _until(ws, "session.pong")
        ws.send(json.dumps({"type": "session.stop"}))
        done = _until(ws, "session.done")
        assert done["stopped"] is True


def test_a_live_session_ends_at_the_session_time_limit(rstack: Stack, tmp_path: Path) -> None:
    """A second API process on the same bus with a 1 s session limit; 45 frames at 60 fps
    (0.75 s of video) pass the start check, but four 1280x720 chunks take longer to make."""
    strict = rstack.sibling(tmp_path, {"OMNIQ_REALTIME__MAX_SESSION_S": "1"})
    strict.start(workers=0)
    try:
        with _ws(strict) as ws:
            ws.send(json.dumps({**START, "num_frames": 69, "fps": 60}))  # 6 chunks: 1.15 s
            error = _json(ws, timeout=10)
            assert (error["code"], error["param"]) == ("invalid_num_frames", "num_frames")
        with _ws(strict) as ws:
            big = {"width": 1280, "height": 720, "num_frames": 45, "fps": 60}
            ws.send(json.dumps({**START, **big}))
            started = _json(ws, timeout=20)
            assert started["type"] == "video.start"
            error = _until(ws, "error", timeout=30)
            assert error["code"] == "session_expired" and "1 s" in error["message"]
            assert _closed_with(ws) == 1008
        # the worker was told to stop: it ends the session and frees its slot
        deadline = time.monotonic() + 60
        ended = f"session {started['request_id']}: stopped"
        while ended not in rstack.log("rt0") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ended in rstack.log("rt0")
    finally:
        strict.stop()
