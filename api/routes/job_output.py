"""A job's output routes, for any kind: ``…/{id}/content`` (the artifact, streamed or a
presigned redirect), ``…/{id}/events`` (SSE) and ``WS …/{id}/stream``; added to the
kind's router by :func:`api.routes.jobs.job_router`. The event routes follow the job's
Redis Stream (:mod:`api.job_stream`): any number of watchers, a late one gets the
retained history first, ``Last-Event-ID`` (or ``?last_event_id=``) resumes exactly after
the last event seen, and the stream ends with ``done``.
"""

# No ``from __future__ import annotations``: see api/job_kinds.py.
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from api.content import stream_artifact
from api.job_kinds import Caller, JobKind, caller_dep, job_id_param
from api.job_stream import follow, parse_cursor, serve_websocket, sse
from api.metrics import WATCHERS
from api.openapi import REDIRECT, SSE, binary, errors
from api.state import AppState
from models.errors import InvalidRequest


def _redirect(redirect: bool | None = None) -> bool | None:
    """``?redirect=``; a dependency so that it follows the kind's ``?variant=``."""
    return redirect


def add_output_routes(router: APIRouter, kind: JobKind) -> None:
    caller, id_path, noun, item = caller_dep(kind), job_id_param(kind), kind.noun, kind.item
    id_param = kind.service.id_param

    @router.get(
        f"{item}/content",
        name=f"{noun}_content",
        description=kind.content_doc,
        response_class=Response,
        responses={
            200: binary(kind.content_200, *kind.media_types),
            206: binary("The requested byte range.", *kind.media_types),
            302: REDIRECT,
            **errors(400, 401, 404, 410, 416, 422, 503),
        },
    )
    async def content(
        job_id: Annotated[str, id_path],
        call: Annotated[Caller, caller],
        variant: Annotated[str, Depends(kind.variant)],
        redirect: Annotated[bool | None, Depends(_redirect)],
        range_header: Annotated[str | None, Header(alias="Range")] = None,
    ) -> Response:
        svc = call.service
        job, artifact = await svc.state.blocking(svc.content_artifact, job_id, call.owner, variant)
        store = svc.state.artifacts
        if redirect if redirect is not None else svc.settings.s3.redirect_content:
            name = svc.filename(job, variant)
            url = await svc.state.blocking(store.presign_get, artifact.key, filename=name)
            return RedirectResponse(url, status_code=302)
        headers = svc.content_headers(job)
        return await stream_artifact(store, artifact, range_header, headers, id_param)

    @router.get(
        f"{item}/events",
        name=f"{noun}_events",
        description=kind.events_doc,
        response_class=Response,
        responses={200: SSE, **errors(400, 401, 404, 422)},
    )
    async def events(
        job_id: Annotated[str, id_path],
        call: Annotated[Caller, caller],
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
        last_event_id_q: Annotated[str | None, Query(alias="last_event_id")] = None,
    ) -> StreamingResponse:
        svc, owner = call.service, call.owner
        after = parse_cursor(last_event_id, last_event_id_q)
        await svc.state.blocking(svc.get_job, job_id, owner)  # 404 for others' jobs

        async def body() -> AsyncIterator[str]:
            with WATCHERS.labels("sse").track_inprogress():
                async for entry in follow(svc.state, svc, job_id, owner, after):
                    yield sse(entry)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    @router.websocket(f"{item}/stream", name=f"{noun}_stream")
    async def stream(
        websocket: WebSocket, job_id: Annotated[str, id_path], last_event_id: str = "0-0"
    ) -> None:
        try:
            cursor = parse_cursor(None, last_event_id)
        except InvalidRequest as exc:  # refused before accepting, like a bad key
            await websocket.close(code=1008, reason=exc.message[:120])
            return
        state: AppState = websocket.state.app
        await serve_websocket(websocket, kind.service(state), job_id, cursor)
