"""The bodies of a job's output routes, for any kind: ``…/{id}/content`` (the artifact,
streamed or a presigned redirect), ``…/{id}/events`` (SSE) and ``WS …/{id}/stream``;
each kind's route module (``api/routes/videos.py``, ``api/routes/audio.py``) declares
the routes and delegates here. The event routes follow the job's Redis Stream
(:mod:`api.job_stream`): any number of watchers, a late one gets the retained history
first, ``Last-Event-ID`` (or ``?last_event_id=``) resumes exactly after the last event
seen, and the stream ends with ``done``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Header, Query, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from api.content import stream_artifact
from api.job_stream import follow, parse_cursor, serve_websocket, sse
from api.jobs_service import JobService
from api.metrics import WATCHERS
from api.openapi import REDIRECT, Responses, binary, errors
from api.routes.jobs import Caller
from api.state import AppState
from models.errors import InvalidRequest


def _redirect(redirect: bool | None = None) -> bool | None:
    """``?redirect=``; a dependency so that it follows the kind's ``?variant=``."""
    return redirect


# The content route's ``?redirect=`` and ``Range`` header.
Redirect = Annotated[bool | None, Depends(_redirect)]
RangeHeader = Annotated[str | None, Header(alias="Range")]
# The events route's cursor: the ``Last-Event-ID`` header, or ``?last_event_id=``.
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID")]
LastEventIdQuery = Annotated[str | None, Query(alias="last_event_id")]


def content_responses(content_200: str, media_types: tuple[str, ...]) -> Responses:
    """The content route's ``responses=``: ``content_200`` says what the content is."""
    return {
        200: binary(content_200, *media_types),
        206: binary("The requested byte range.", *media_types),
        302: REDIRECT,
        **errors(400, 401, 404, 410, 416, 422, 503),
    }


async def job_content(
    call: Caller, job_id: str, variant: str, redirect: bool | None, range_header: str | None
) -> Response:
    """The artifact ``variant`` of the job: streamed (``Range`` honoured), or a 302 to
    a presigned URL (``?redirect=``, else ``OMNIQ_S3__REDIRECT_CONTENT``)."""
    svc = call.service
    job, artifact = await svc.state.blocking(svc.content_artifact, job_id, call.owner, variant)
    store = svc.state.artifacts
    if redirect if redirect is not None else svc.settings.s3.redirect_content:
        name = svc.filename(job, variant)
        url = await svc.state.blocking(store.presign_get, artifact.key, filename=name)
        return RedirectResponse(url, status_code=302)
    headers = svc.content_headers(job)
    return await stream_artifact(store, artifact, range_header, headers, svc.id_param)


async def job_events(
    call: Caller, job_id: str, last_event_id: str | None, last_event_id_q: str | None
) -> StreamingResponse:
    """The job's events as Server-Sent Events, after the cursor if one is given."""
    svc, owner = call.service, call.owner
    after = parse_cursor(last_event_id, last_event_id_q)
    await svc.state.blocking(svc.get_job, job_id, owner)  # 404 for others' jobs

    async def body() -> AsyncIterator[str]:
        with WATCHERS.labels("sse").track_inprogress():
            async for entry in follow(svc.state, svc, job_id, owner, after):
                yield sse(entry)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


async def job_stream(
    websocket: WebSocket, cls: type[JobService[Any, Any]], job_id: str, last_event_id: str
) -> None:
    """The job's events over a WebSocket of the kind ``cls``, after ``last_event_id``."""
    try:
        cursor = parse_cursor(None, last_event_id)
    except InvalidRequest as exc:  # refused before accepting, like a bad key
        await websocket.close(code=1008, reason=exc.message[:120])
        return
    state: AppState = websocket.state.app
    await serve_websocket(websocket, cls(state), job_id, cursor)
