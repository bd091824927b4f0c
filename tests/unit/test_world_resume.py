"""Resume of a ``WS /v1/realtime/video`` session, sans-I/O: a protocol rebuilt on a new
socket (``WorldSessionProtocol.restored``) and fed the worker's outputs again from the
start sends ``session.resumed``, the init segment alone, then exactly the chunks after the
client's last one; together with the chunks the client already had they decode to every
frame once. Real fMP4 bytes from the worker's writer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from models.realtime_video import VideoConfig
from models.realtime_video_chunks import frames_in_chunk
from models.session_bus import ChunkOutput
from realtime.fmp4_split import NotFragmented, split_init
from realtime.video_protocol import (
    CLOSE_POLICY,
    State,
    StopRequested,
    WorldSessionOptions,
    WorldSessionProtocol,
)
from tests.unit.test_fmp4 import _boxes, _decode, _frames
from tests.unit.world_session_client import start_json as _start
from tests.unit.world_session_client import texts as _texts
from workers.media.fmp4 import FragmentedMP4Writer

W, H, FPS = 64, 48, 16
CONFIG = VideoConfig(width=W, height=H, fps=FPS, num_frames=57, chunks=5)


def _chunks() -> list[bytes]:
    writer = FragmentedMP4Writer(W, H, FPS)
    out, start = [], 0
    for i in range(CONFIG.chunks):
        out.append(writer.write_chunk(_frames(frames_in_chunk(i), start)))
        start += frames_in_chunk(i)
    writer.close()
    return out


def _feed(p: WorldSessionProtocol, chunks: list[bytes], upto: int) -> None:
    for i in range(upto):
        output = ChunkOutput(
            kind="media",
            produced_at=100.0 + i,
            generation_chunk_index=i,
            num_frames=frames_in_chunk(i),
        )
        p.chunk(output, chunks[i], now=1.0)


def _pairs(frames: list[str | bytes]) -> list[tuple[dict[str, Any], bytes | None]]:
    """Text frames, each with the binary frame that follows its chunk metadata."""
    out: list[tuple[dict[str, Any], bytes | None]] = []
    for frame in frames:
        if isinstance(frame, bytes):
            meta, _ = out[-1]
            assert meta["type"] == "video.chunk_metadata" and meta["byte_length"] == len(frame)
            out[-1] = (meta, frame)
        else:
            out.append((_texts([frame])[0], None))
    return out


def _restored(now: float = 50.0, **kw: Any) -> WorldSessionProtocol:
    return WorldSessionProtocol.restored(
        "rtv_1",
        now,
        WorldSessionOptions(),
        config=CONFIG,
        resume_token="tok",
        event_ids=kw.get("event_ids", ["ui-1"]),
        default_transition=None,
        expires_at=kw.get("expires_at"),
    )


def test_split_init_cuts_before_the_first_moof() -> None:
    first = _chunks()[0]
    init, rest = split_init(first)
    assert _boxes(init) == ["ftyp", "moov"] and _boxes(rest)[0] == "moof"
    assert init + rest == first
    with pytest.raises(NotFragmented):
        split_init(rest)  # no init segment before it


@pytest.mark.parametrize("last", [-1, 0, 1, 3])
def test_a_resumed_socket_gets_the_init_segment_then_the_chunks_after_the_last_one(
    last: int,
) -> None:
    chunks = _chunks()
    got_before = chunks[: last + 1]  # what the first socket delivered
    p = _restored()
    p.resume(last)
    p.started(now=50.0)  # the worker's stream is replayed from its start: ignored
    p.receive_text(json.dumps({"type": "session.ping"}), 50.0)  # held until the init
    _feed(p, chunks, CONFIG.chunks)
    p.finished(stopped=False)
    out = _pairs(p.data_to_send())
    resumed, init = out[0][0], out[1]
    assert resumed == {
        "type": "session.resumed",
        "request_id": "rtv_1",
        "session_id": "rtv_1",
        "next_generation_chunk_index": last + 1,
    }
    assert init[0]["kind"] == "init" and init[0]["generation_chunk_index"] is None
    assert init[0]["transport_chunk_index"] == 0 and init[1] is not None
    assert out[2][0]["type"] == "session.pong"
    media = [(m, data) for m, data in out if m.get("kind") == "media"]
    assert [m["generation_chunk_index"] for m, _ in media] == list(range(last + 1, 5))
    assert [m["transport_chunk_index"] for m, _ in media] == list(range(1, len(media) + 1))
    done = out[-1][0]
    assert done["type"] == "session.done" and done["chunks"] == 5 and not done["stopped"]
    assert p.close_code == 1000
    # the new socket alone plays (init + what follows) ...
    tail = init[1] + b"".join(data or b"" for _, data in media)
    if media:
        assert len(_decode(tail)) == sum(frames_in_chunk(i) for i in range(last + 1, 5))
    # ... and with what the first socket had, every frame once
    had = b"".join(got_before) if got_before else init[1]  # chunk 0 holds the init segment
    whole = had + b"".join(data or b"" for _, data in media)
    assert len(_decode(whole)) == CONFIG.num_frames


def test_interactions_and_their_ids_carry_over() -> None:
    p = _restored(event_ids=["ui-1"])
    p.resume(0)
    interaction = {"event_id": "ui-1", "event": {"prompt": "rain"}}
    p.receive_text(json.dumps({"type": "session.interaction", "interaction": interaction}), 1.0)
    assert p.events_received() == []  # a conflict, answered once the init is out
    _feed(p, _chunks(), 1)
    kinds = [e[0]["type"] for e in _pairs(p.data_to_send())]
    assert kinds == ["session.resumed", "video.chunk_metadata", "error"]


def test_the_expiry_of_the_original_session_holds() -> None:
    p = _restored(now=10.0, expires_at=12.0)
    p.resume(-1)
    p.data_to_send()
    assert p.next_deadline() == 12.0
    p.check_timeouts(12.0)
    assert [c for c in p.events_received() if isinstance(c, StopRequested)]
    assert _texts(p.data_to_send())[-1]["code"] == "session_expired"


def test_taken_over_ends_the_socket_without_stopping_the_worker() -> None:
    p = WorldSessionProtocol("rtv_2", 0.0)
    p.receive_text(_start(width=64, height=48, image_reference=None, extra_params=None), 0.0)
    p.events_received()
    p.started(now=0.0)
    start = _texts(p.data_to_send())[0]
    assert start["session_id"] == "rtv_2" and start["resume_token"] == p.resume_token
    p.taken_over()
    assert p.events_received() == []
    error = _texts(p.data_to_send())[-1]
    assert error["code"] == "session_taken_over" and p.close_code == CLOSE_POLICY
    assert p.state is State.FAILED


def test_a_refused_resume_closes_with_session_not_found() -> None:
    p = WorldSessionProtocol("rtv_3", 0.0)
    p.resume_refused()
    error = _texts(p.data_to_send())[0]
    assert error["code"] == "session_not_found" and p.close_code == CLOSE_POLICY
