"""One router for every job kind: create, list, retrieve, delete, cancel, content, events
and stream, over a :class:`api.jobs_service.JobService` and the kind's wire models.

``/v1/videos`` (``api/routes/videos.py``) and ``/v1/audio/generations``
(``api/routes/audio.py``) are each :func:`job_router` of their :class:`JobKind`. Paths,
JSON, status codes, headers and operation ids are the ones clients and ``/openapi.json``
have always had: each route keeps its old function name (``retrieve_video``,
``audio_content``) and the path parameter its old name (``video_id``, ``audio_id``).
"""

# No ``from __future__ import annotations``: FastAPI reads the annotations of the routes
# defined inside job_router at runtime, and they name its local aliases.
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.content import stream_artifact
from api.deps import CurrentOwner, IdempotencyKey, StateDep
from api.forms import read_create_body
from api.job_stream import follow, parse_cursor, serve_websocket, sse
from api.jobs_service import JobService
from api.openapi import REDIRECT, SSE, binary, create_body, errors
from api.responses import json_response
from api.state import AppState
from models.errors import InvalidRequest


@dataclass(frozen=True)
class JobKind:
    """What differs between the job kinds' route sets."""

    prefix: str  # ``/v1/videos``
    tag: str
    noun: str  # names the routes: ``create_{noun}``, ``{noun}_content``
    plural: str  # ``list_{plural}``
    service: type[JobService[Any]]
    create: type[BaseModel]  # the create body, as /openapi.json declares it
    object: type[BaseModel]
    page: type[BaseModel]
    deleted: type[BaseModel]
    media_types: tuple[str, ...]
    content_200: str  # what the content is, for /openapi.json
    # ``?variant=`` of the content route: a dependency returning the variant asked for.
    variant: Callable[..., str]
    content_doc: str | None = None
    events_doc: str | None = None


def _redirect(redirect: bool | None = None) -> bool | None:
    """``?redirect=``; a dependency so that it follows the kind's ``?variant=``."""
    return redirect


def job_router(kind: JobKind) -> APIRouter:
    router = APIRouter(prefix=kind.prefix, tags=[kind.tag])
    cls, noun, id_param = kind.service, kind.noun, kind.service.id_param

    async def service(state: StateDep) -> JobService[Any]:
        return cls(state)

    Service = Annotated[JobService[Any], Depends(service)]
    JobId = Annotated[str, Path(alias=id_param)]
    item = f"/{{{id_param}}}"

    def _object(svc: JobService[Any], obj: BaseModel) -> Response:
        return json_response(obj, {"openai-poll-after-ms": str(svc.settings.poll_after_ms)})

    @router.post(
        "",
        name=f"create_{noun}",
        response_model=kind.object,
        responses=errors(400, 401, 413, 422, 503),
        openapi_extra=create_body(kind.create),
    )
    async def create(
        request: Request, svc: Service, owner: CurrentOwner, idempotency_key: IdempotencyKey = None
    ) -> Response:
        raw, upload = await read_create_body(request, svc.settings.limits)
        return _object(svc, await svc.create(raw, upload, owner, idempotency_key))

    @router.get(
        "", name=f"list_{kind.plural}", response_model=kind.page, responses=errors(400, 401, 422)
    )
    async def page(
        svc: Service,
        owner: CurrentOwner,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
    ) -> Response:
        # An empty ``after=`` (what some clients send for "no cursor") is no cursor.
        return json_response(await run_in_threadpool(svc.page, owner, after or None, limit, order))

    @router.get(
        item, name=f"retrieve_{noun}", response_model=kind.object, responses=errors(401, 404, 422)
    )
    async def retrieve(job_id: JobId, svc: Service, owner: CurrentOwner) -> Response:
        return _object(svc, await run_in_threadpool(svc.retrieve, job_id, owner))

    @router.delete(
        item,
        name=f"delete_{noun}",
        response_model=kind.deleted,
        responses=errors(401, 404, 422, 503),
    )
    async def delete(job_id: JobId, svc: Service, owner: CurrentOwner) -> Response:
        # S3 deletes: on the S3 pool, so a stalled S3 cannot starve database reads
        await svc.state.artifacts.run(svc.delete, job_id, owner)
        return json_response(kind.deleted(id=job_id))

    @router.post(
        f"{item}/cancel",
        name=f"cancel_{noun}",
        response_model=kind.object,
        responses=errors(401, 404, 422),
    )
    async def cancel(job_id: JobId, svc: Service, owner: CurrentOwner) -> Response:
        return _object(svc, await run_in_threadpool(svc.cancel, job_id, owner))

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
        job_id: JobId,
        svc: Service,
        owner: CurrentOwner,
        variant: Annotated[str, Depends(kind.variant)],
        redirect: Annotated[bool | None, Depends(_redirect)],
        range_header: Annotated[str | None, Header(alias="Range")] = None,
    ) -> Response:
        job, artifact = await run_in_threadpool(svc.content_artifact, job_id, owner, variant)
        store = svc.state.artifacts
        if redirect if redirect is not None else svc.settings.s3.redirect_content:
            name = svc.filename(job, variant)
            url = await run_in_threadpool(store.presign_get, artifact.key, filename=name)
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
        job_id: JobId,
        svc: Service,
        owner: CurrentOwner,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
        last_event_id_q: Annotated[str | None, Query(alias="last_event_id")] = None,
    ) -> StreamingResponse:
        after = parse_cursor(last_event_id, last_event_id_q)
        await run_in_threadpool(svc.get_job, job_id, owner)  # 404 for others' jobs

        async def body() -> AsyncIterator[str]:
            async for entry in follow(svc.state, svc, job_id, owner, after):
                yield sse(entry)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    @router.websocket(f"{item}/stream", name=f"{noun}_stream")
    async def stream(websocket: WebSocket, job_id: JobId, last_event_id: str = "0-0") -> None:
        try:
            cursor = parse_cursor(None, last_event_id)
        except InvalidRequest as exc:  # refused before accepting, like a bad key
            await websocket.close(code=1008, reason=exc.message[:120])
            return
        state: AppState = websocket.state.app
        await serve_websocket(websocket, cls(state), job_id, cursor)

    return router
