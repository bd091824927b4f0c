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
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from api.deps import CurrentOwner, IdempotencyKey
from api.forms import read_create_body
from api.job_kinds import JobKind, job_id_param, service_dep
from api.jobs_service import JobService
from api.openapi import create_body, errors
from api.responses import json_response
from api.routes.job_output import add_output_routes


def job_router(kind: JobKind) -> APIRouter:
    """Create, list, retrieve, delete and cancel, then the output routes."""
    router = APIRouter(prefix=kind.prefix, tags=[kind.tag])
    svc_dep, id_path, noun, item = service_dep(kind), job_id_param(kind), kind.noun, kind.item

    def _object(svc: JobService[Any], obj: BaseModel) -> Response:
        return json_response(obj, {"openai-poll-after-ms": str(svc.settings.poll_after_ms)})

    def _object_route(call: Callable[[JobService[Any]], Callable[[str, str], BaseModel]]) -> Any:
        """Retrieve and cancel: the job's object as the service method ``call(svc)`` returns
        it for ``(job_id, owner)`` (a blocking call, on the request pool)."""

        async def route(
            job_id: Annotated[str, id_path],
            svc: Annotated[JobService[Any], svc_dep],
            owner: CurrentOwner,
        ) -> Response:
            return _object(svc, await svc.state.blocking(call(svc), job_id, owner))

        return route

    @router.post(
        "",
        name=f"create_{noun}",
        response_model=kind.object,
        responses=errors(400, 401, 413, 422, 503),
        openapi_extra=create_body(kind.create),
    )
    async def create(
        request: Request,
        svc: Annotated[JobService[Any], svc_dep],
        owner: CurrentOwner,
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        raw, upload = await read_create_body(request, svc.settings.limits)
        return _object(svc, await svc.create(raw, upload, owner, idempotency_key))

    @router.get(
        "", name=f"list_{kind.plural}", response_model=kind.page, responses=errors(400, 401, 422)
    )
    async def page(
        svc: Annotated[JobService[Any], svc_dep],
        owner: CurrentOwner,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
    ) -> Response:
        # An empty ``after=`` (what some clients send for "no cursor") is no cursor.
        return json_response(await svc.state.blocking(svc.page, owner, after or None, limit, order))

    router.get(
        item, name=f"retrieve_{noun}", response_model=kind.object, responses=errors(401, 404, 422)
    )(_object_route(lambda svc: svc.retrieve))

    @router.delete(
        item,
        name=f"delete_{noun}",
        response_model=kind.deleted,
        responses=errors(401, 404, 422, 503),
    )
    async def delete(
        job_id: Annotated[str, id_path],
        svc: Annotated[JobService[Any], svc_dep],
        owner: CurrentOwner,
    ) -> Response:
        # S3 deletes: on the S3 pool, so a stalled S3 cannot starve database reads
        await svc.state.artifacts.run(svc.delete, job_id, owner)
        return json_response(kind.deleted(id=job_id))

    router.post(
        f"{item}/cancel",
        name=f"cancel_{noun}",
        response_model=kind.object,
        responses=errors(401, 404, 422),
    )(_object_route(lambda svc: svc.cancel))

    add_output_routes(router, kind)
    return router
