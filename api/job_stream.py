"""Following a job's events on the bus, for any kind of job (SSE, WebSocket, streamed
speech): a late watcher gets the retained history first, ``after`` resumes exactly after
the last event seen, and the stream ends with ``done``. When the stream has expired (or a
``done`` was never published: the bus was down when the worker ended the job) the job row
is the truth: a watcher of a finished job gets a ``status`` and a ``done`` made from it,
without ids when it had seen events already. When Redis does not answer (down or stalled), the
watcher gets an ``error`` event (``broker_error``, no id) and the stream ends: SSE ends the
response, the WebSocket closes with 1011.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from api.deps import websocket_owner
from api.jobs_service import JobService
from api.metrics import WATCHERS
from api.state import AppState
from models.common import JobError
from models.db import JobStatus
from models.errors import InvalidRequest, OmniqueueError
from models.events import DoneEvent, StatusEvent, StreamErrorEvent
from storage.bus import BusEntry, BusUnavailable
from storage.constants import job_events_key

BLOCK_MS = 15_000
# A Redis Stream id: ``<ms>`` or ``<ms>-<seq>``, each part an unsigned 64-bit integer.
_CURSOR_RE = re.compile(r"^([0-9]{1,20})(?:-([0-9]{1,20}))?$")
_U64_MAX = 2**64 - 1
# Ids of events made from the job row; they sort before any real stream id.
_SYNTHETIC = ("0-1", "0-2")
BUS_ERROR = BusEntry(
    "",
    StreamErrorEvent(
        error=JobError(
            code="broker_error",
            message="live events are unavailable (the event bus did not answer); "
            "the job goes on: read its status, or reconnect with the last event id",
        )
    ).model_dump(mode="json"),
)


def _synthetic(service: JobService, job_id: str, owner: str) -> list[BusEntry] | None:
    """``status`` + ``done`` from the row if the job has ended, else None."""
    try:
        job = service.get_job(job_id, owner)
    except OmniqueueError:
        return []  # deleted meanwhile: end the stream
    if job.status not in (JobStatus.COMPLETED, JobStatus.FAILED):
        return None
    error = None
    if job.status == JobStatus.FAILED:
        error = JobError(code=job.error_code or "internal_error", message=job.error_message or "")
    status = job.status.value if isinstance(job.status, JobStatus) else str(job.status)
    events = [
        StatusEvent(status=status),
        DoneEvent(status=status, error=error),
    ]
    return [BusEntry(i, e.model_dump(mode="json")) for i, e in zip(_SYNTHETIC, events, strict=True)]


def parse_cursor(header: str | None, query: str | None) -> str:
    """The stream id to resume after, from ``Last-Event-ID`` (first) or ``?last_event_id=``;
    a value that is not a stream id is refused (400 naming it) before any response starts."""
    for value, param in ((header, "Last-Event-ID"), (query, "last_event_id")):
        if not value:
            continue
        m = _CURSOR_RE.match(value.strip())
        if m is None or any(int(part) > _U64_MAX for part in m.groups() if part is not None):
            raise InvalidRequest(f"{param} must be an event id like '1700000000000-0'", param=param)
        return value.strip()
    return "0-0"


async def follow(
    state: AppState, service: JobService, job_id: str, owner: str, after: str
) -> AsyncIterator[BusEntry | None]:
    """The job's events after ``after``, then live ones, ending with ``done``; yields None
    as a keep-alive when nothing happened for a while."""
    stream = job_events_key(job_id)
    timeout = state.settings.redis.command_timeout_s
    # The first read does not wait: with nothing after ``after`` (the stream expired, or
    # its end was never published) a finished job's end comes from its row at once, not
    # after a whole BLOCK_MS of waiting for events that will never come.
    block_ms: int | None = None
    while True:
        try:
            entries = await state.abus.read(stream, after, block_ms=block_ms, timeout_s=timeout)
        except BusUnavailable:
            yield BUS_ERROR
            return
        waited, block_ms = block_ms is not None, BLOCK_MS
        if not entries:
            synthetic = await state.blocking(_synthetic, service, job_id, owner)
            if synthetic is not None:
                for entry in synthetic:
                    # Synthetic ids sort before real ones: past them (a watcher saw events,
                    # but the worker could not publish the end), the end has no id.
                    yield entry if entry.id > after else BusEntry("", entry.event)
                return
            if waited:  # a keep-alive after a wait, not after the first look
                yield None
            continue
        for entry in entries:
            after = entry.id
            yield entry
            if entry.type == "done":
                return


def wire(entry: BusEntry) -> dict[str, Any]:
    return {"id": entry.id, **entry.event} if entry.id else dict(entry.event)


def sse(entry: BusEntry | None) -> str:
    """One Server-Sent Event (binary data base64 in ``data_b64``), or a keep-alive."""
    if entry is None:
        return ": keep-alive\n\n"
    body = wire(entry)
    if entry.data is not None:
        body["data_b64"] = base64.b64encode(entry.data).decode()
    frame = f"event: {entry.type}\ndata: {json.dumps(body)}\n\n"
    return f"id: {entry.id}\n{frame}" if entry.id else frame  # no id: Last-Event-ID stays


async def serve_websocket(
    websocket: WebSocket, service: JobService, job_id: str, last_event_id: str
) -> None:
    """``WS …/{id}/stream``: the same events as SSE, one JSON text frame each; an event
    with binary data (``chunk``) carries ``byte_length`` and is followed by one binary
    frame. Same auth and 404 rules as GET (close 1008 before accepting)."""
    owner, subprotocol = await websocket_owner(websocket, service.state)
    if owner is None:
        await websocket.close(code=1008, reason="invalid or missing API key")
        return
    try:
        await service.state.blocking(service.get_job, job_id, owner)
    except OmniqueueError as exc:
        await websocket.close(code=1008, reason=exc.message[:120])
        return
    await websocket.accept(subprotocol=subprotocol)
    try:
        with WATCHERS.labels("websocket").track_inprogress():
            await _send_events(websocket, service, job_id, owner, last_event_id)
    except WebSocketDisconnect:
        return


async def _send_events(
    websocket: WebSocket, service: JobService, job_id: str, owner: str, last_event_id: str
) -> None:
    async for entry in follow(service.state, service, job_id, owner, last_event_id):
        if entry is None:
            continue
        message = wire(entry)
        if entry.data is not None:
            message["byte_length"] = len(entry.data)
        await websocket.send_text(json.dumps(message))
        if entry is BUS_ERROR:
            await websocket.close(code=1011, reason="event bus unavailable")
            return
        if entry.data is not None:
            await websocket.send_bytes(entry.data)
    await websocket.close(code=1000)
