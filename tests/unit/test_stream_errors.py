"""The ``error`` events of job streams are :class:`models.events.StreamErrorEvent`: the
bus failure of ``/events`` and ``/stream``, and a speech SSE stream whose job failed
after audio had been sent."""

from __future__ import annotations

import json

from api.audio_sync import _sse_done
from api.job_stream import BUS_ERROR, sse, wire
from models.events import DoneEvent, StreamErrorEvent


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
    assert body["type"] == "speech.audio.done"
