"""One router for every job kind: create, list, retrieve, delete, cancel, and the output
routes of ``api/routes/job_output.py`` (content, events, stream), over a
:class:`api.jobs_service.JobService` and the kind's wire models.

``/v1/videos`` (``api/routes/videos.py``) and ``/v1/audio/generations``
(``api/routes/audio.py``) are each :func:`job_router` of their
:class:`api.job_kinds.JobKind`. Paths,
JSON, status codes, headers and operation ids are the ones clients and ``/openapi.json``
have always had: each route keeps its old function name (``retrieve_video``,
``audio_content``) and the path parameter its old name (``video_id``, ``audio_id``).
"""

# No ``from __future__ import annotations``: see api/job_kinds.py.
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from api.admission import Admitted, admission
from api.deps import IdempotencyKey
from api.forms import read_create_body
from api.job_kinds import Caller, JobKind, caller_dep, caller_of, job_id_param
from api.jobs_service import JobService
from api.openapi import create_body, errors
from api.responses import json_response
from api.routes.job_output import add_output_routes


def job_router(kind: JobKind) -> APIRouter:
    """Create, list, retrieve, delete and cancel, then the output routes."""
    router = APIRouter(prefix=kind.prefix, tags=[kind.tag])
    caller, id_path, noun, item = caller_dep(kind), job_id_param(kind), kind.noun, kind.item
    caller_of_kind = caller_of(kind)

    def _object(svc: JobService[Any, Any], obj: BaseModel) -> Response:
        return json_response(obj, {"openai-poll-after-ms": str(svc.settings.poll_after_ms)})

    @router.post(
        "",
        name=f"create_{noun}",
        response_model=kind.object,
        responses=errors(400, 401, 413, 422, 429, 503),
        openapi_extra=create_body(kind.create),
    )
    async def create(
        request: Request,
        call: Annotated[Admitted[JobService[Any, Any]], admission(kind.service)],
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        svc = call.service
        raw, upload = await read_create_body(request, svc.settings.limits)
        created = await svc.create(kind.parse(raw, upload), call.owner, idempotency_key)
        return call.answer(_object(svc, created))

    @router.get(
        "", name=f"list_{kind.plural}", response_model=kind.page, responses=errors(400, 401, 422)
    )
    async def page(
        call: Annotated[Caller, caller],
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
    ) -> Response:
        svc = call.service
        # An empty ``after=`` (what some clients send for "no cursor") is no cursor.
        listing = await svc.state.blocking(svc.page, call.owner, after or None, limit, order)
        return json_response(listing)

    @router.get(
        item, name=f"retrieve_{noun}", response_model=kind.object, responses=errors(401, 404, 422)
    )
    async def retrieve(request: Request, job_id: Annotated[str, id_path]) -> Response:
        # The caller is resolved here rather than by a dependency: FastAPI's solving of
        # even one sub-dependency (its cache key, scope and generator checks) was ~8% of
        # a status read, the most frequent request. Nothing in this route's parameters
        # can fail validation (the path matched), so a missing key still answers 401.
        call = await caller_of_kind(request)
        svc = call.service
        return _object(svc, await svc.state.blocking(svc.retrieve, job_id, call.owner))

    @router.delete(
        item,
        name=f"delete_{noun}",
        response_model=kind.deleted,
        responses=errors(401, 404, 422, 503),
    )
    async def delete(job_id: Annotated[str, id_path], call: Annotated[Caller, caller]) -> Response:
        svc = call.service
        # S3 deletes: on the S3 pool, so a stalled S3 cannot starve database reads
        await svc.state.artifacts.run(svc.delete, job_id, call.owner)
        return json_response(kind.deleted(id=job_id))

    @router.post(
        f"{item}/cancel",
        name=f"cancel_{noun}",
        response_model=kind.object,
        responses=errors(401, 404, 422),
    )
    async def cancel(job_id: Annotated[str, id_path], call: Annotated[Caller, caller]) -> Response:
        svc = call.service
        return _object(svc, await svc.state.blocking(svc.cancel, job_id, call.owner))

    add_output_routes(router, kind)
    return router
