"""A scripted peer of the ``WS /v1/realtime/video`` state machine for the sans-I/O tests
(``test_world_session.py``, ``test_world_start.py``, ``test_world_interactions.py``): start
messages, media chunks from the "worker", and server events checked against the schemas."""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from models.realtime_video import ServerEvent
from models.realtime_video_chunks import frames_in_chunk
from models.session_bus import ChunkOutput
from realtime.video_protocol import (
    StartRequested,
    StopReason,
    StopRequested,
    WorldSessionOptions,
    WorldSessionProtocol,
)

INIT = b"\x00\x00\x00\x18ftypiso6" + b"\x00" * 12 + b"moov"
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ServerEvent)


def start_json(**fields: Any) -> str:
    message = {
        "type": "session.start",
        "model": "reference/world",
        "prompt": "a quiet street",
        "width": 832,
        "height": 480,
        "num_frames": 33,
        "fps": 16,
        "seed": 42,
        "image_reference": {"image_url": "data:image/png;base64,Zm9v"},
        "extra_params": {"flow_shift": 5.0, "camera_action_script": [[["w"], ["w"], ["w"]]] * 3},
    }
    message.update(fields)
    return json.dumps({k: v for k, v in message.items() if v is not None})


def texts(frames: list[str | bytes]) -> list[dict[str, Any]]:
    """Decode every text frame, checking it against the server event schemas."""
    events = [json.loads(frame) for frame in frames if isinstance(frame, str)]
    for event in events:
        SERVER_EVENT.validate_python(event)
    return events


def one_event(p: WorldSessionProtocol) -> dict[str, Any]:
    frames = p.data_to_send()
    assert len(frames) == 1 and isinstance(frames[0], str), frames
    return texts(frames)[0]


def new_session(now: float = 0.0, **options: Any) -> WorldSessionProtocol:
    ids = iter(f"generated-{n}" for n in range(100))
    return WorldSessionProtocol(
        "video_stream-1", now, WorldSessionOptions(**options), new_event_id=lambda: next(ids)
    )


def streaming(now: float = 0.0, start: str | None = None, **options: Any) -> WorldSessionProtocol:
    p = new_session(now, **options)
    p.receive_text(start or start_json(), now)
    assert isinstance(p.events_received()[0], StartRequested)
    p.started(now=now)
    assert one_event(p)["type"] == "video.start"
    return p


def send_media(p: WorldSessionProtocol, index: int, now: float = 0.0, **ids: Any) -> None:
    data = (INIT if index == 0 else b"") + b"moof" + bytes([index]) * 32
    output = ChunkOutput(
        kind="media",
        produced_at=100.0 + index,
        generation_chunk_index=index,
        num_frames=frames_in_chunk(index),
        **ids,
    )
    p.chunk(output, data, now=now)


def error_event(p: WorldSessionProtocol) -> dict[str, Any]:
    event = one_event(p)
    assert event["type"] == "error", event
    return event


def timed_out(p: WorldSessionProtocol, deadline: float, reason: StopReason) -> dict[str, Any]:
    """A live session's timeout: nothing happens just before ``deadline``; at it the worker
    is told to stop for ``reason`` and the client gets an error event (returned)."""
    p.check_timeouts(deadline - 0.1)
    assert p.data_to_send() == [] and p.events_received() == []
    p.check_timeouts(deadline)
    assert p.events_received() == [StopRequested(reason)]
    return error_event(p)


def interaction_json(event_id: str | None = "ui-1", **interaction: Any) -> str:
    body: dict[str, Any] = {"event": {"prompt": "snow falls"}, **interaction}
    if event_id is not None:
        body["event_id"] = event_id
    return json.dumps({"type": "session.interaction", "interaction": body})
