"""The ``error`` events of job streams are :class:`models.events.StreamErrorEvent`: the
bus failure of ``/events`` and ``/stream``, and a speech SSE stream whose job failed
after audio had been sent."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from api.audio_sync import _sse_done
from api.job_stream import BUS_ERROR, follow, sse, wire
from models.db import JobStatus
from models.events import DoneEvent, StreamErrorEvent
from storage.bus import BusEntry


def _data(frame: bytes | str) -> dict[str, object]:
    text = frame.decode() if isinstance(frame, bytes) else frame
    line = next(x for x in text.splitlines() if x.startswith("data: "))
    return json.loads(line.removeprefix("data: "))


def test_the_bus_error_is_a_stream_error_event_without_an_id() -> None:
    event = StreamErrorEvent.model_validate(wire(BUS_ERROR))
    assert event.error.code == "broker_error"
    frame = sse(BUS_ERROR)
    assert frame.startswith("event: error\n") and "id:" not in frame
    assert _data(frame) == {"type": "error", "error": event.error.model_dump()}


def test_a_speech_stream_whose_job_failed_ends_with_its_error() -> None:
    done = DoneEvent(status="failed", error={"code": "oom", "message": "out of memory"})
    body = _data(_sse_done(done.model_dump(mode="json")))
    assert body == {"type": "error", "error": {"code": "oom", "message": "out of memory"}}


def test_a_failed_done_without_an_error_still_names_a_code() -> None:
    body = _data(_sse_done({"type": "done", "status": "failed", "error": None}))
    error = {"code": "internal_error", "message": "the job failed"}
    assert body == {"type": "error", "error": error}


def test_a_completed_speech_stream_ends_with_speech_audio_done() -> None:
    body = _data(_sse_done(DoneEvent(status="completed").model_dump(mode="json")))
    assert body == {"type": "speech.audio.done"}  # no usage: no model here counts tokens


def test_past_the_last_event_seen_a_missing_end_comes_from_the_row_without_ids() -> None:
    """The worker ended the job while its bus was cut (no ``done`` on the stream): a
    watcher that saw events resumes after them and still gets the end, without ids (the
    row's synthetic ids sort before any event it saw); a new watcher gets them with ids.
    Both at once: the first read does not block (it waited BLOCK_MS, 15 s, before)."""
    blocks: list[object] = []

    class Bus:
        async def read(self, *_: object, block_ms: object = None, **__: object) -> list[object]:
            blocks.append(block_ms)
            return []  # nothing after the cursor (the stream lacks its done)

    async def blocking(fn: Any, *args: Any) -> Any:
        return fn(*args)

    row = SimpleNamespace(status=JobStatus.COMPLETED, error_code=None, error_message=None)
    service = SimpleNamespace(get_job=lambda job_id, owner: row)
    state = SimpleNamespace(
        abus=Bus(),
        blocking=blocking,
        settings=SimpleNamespace(redis=SimpleNamespace(command_timeout_s=1)),
    )

    async def watch(after: str) -> list[BusEntry | None]:
        return [e async for e in follow(state, service, "video_x", "o", after)]  # type: ignore[arg-type]

    resumed = asyncio.run(watch("1796000000000-3"))
    assert [(e.id, e.type) if e else None for e in resumed] == [("", "status"), ("", "done")]
    assert blocks == [None]  # one look, no wait, no keep-alive before the end
    assert "id:" not in sse(resumed[-1]) and _data(sse(resumed[-1]))["status"] == "completed"
    fresh = asyncio.run(watch("0-0"))
    assert [(e.id, e.type) for e in fresh if e] == [("0-1", "status"), ("0-2", "done")]
