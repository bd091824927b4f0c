"""The bodies every job kind's routes share: create, list, retrieve, delete and cancel
(the output routes' are in ``api/routes/job_output.py``), over the kind's
:class:`api.jobs_service.JobService`.

``/v1/videos`` (``api/routes/videos.py``) and ``/v1/audio/generations``
(``api/routes/audio.py``) each declare their routes, decorators written out, and each
route delegates here. Paths, JSON, status codes, headers and operation ids are the ones
clients and ``/openapi.json`` have always had: each route keeps its old function name
(``retrieve_video``, ``audio_content``) and its path parameter its old name
(``video_id``, ``audio_id``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from api.admission import Admitted
from api.deps import authenticate
from api.forms import read_create_body
from api.jobs_service import JobService
from api.responses import json_response
from api.state import AppState

S = TypeVar("S", bound=JobService[Any, Any])
WireT = TypeVar("WireT")
RequestT = TypeVar("RequestT")

# The list routes' ``?limit=`` and ``?order=``.
PageLimit = Annotated[int, Query(ge=1, le=100)]
PageOrder = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class Caller:
    """What a job route gets from its one dependency: the kind's service and the id of
    the API key making the request (``local`` while auth is off)."""

    service: JobService[Any, Any]
    owner: str


def caller_of(cls: type[JobService[Any, Any]]) -> Callable[[Request], Awaitable[Caller]]:
    """The kind's service and the API key of a request (401 without a live key); a
    route's one dependency (``Depends(caller_of(VideoService))``) instead of a service
    and an owner that both depended on the state: FastAPI solved five dependency levels
    per request, a fifth of a status read's CPU."""

    async def caller(request: Request) -> Caller:
        state: AppState = request.state.app
        return Caller(cls(state), await authenticate(request, state))

    return caller


def _object(svc: JobService[Any, Any], obj: BaseModel) -> Response:
    return json_response(obj, {"openai-poll-after-ms": str(svc.settings.poll_after_ms)})


async def create_from_body(
    request: Request,
    svc: JobService[WireT, RequestT],
    owner: str,
    parse: Callable[[dict[str, Any], list[bytes]], RequestT],
    idempotency_key: str | None,
) -> WireT:
    """Read the create body (JSON or multipart, with byte caps), parse it into the
    kind's request (``api/create_requests.py``), store and enqueue the job: its object."""
    raw, upload = await read_create_body(request, svc.settings.limits)
    return await svc.create(parse(raw, upload), owner, idempotency_key)


async def create_job(
    request: Request,
    call: Admitted[S],
    parse: Callable[[dict[str, Any], list[bytes]], Any],
    idempotency_key: str | None,
) -> Response:
    svc = call.service
    created = await create_from_body(request, svc, call.owner, parse, idempotency_key)
    return call.answer(_object(svc, created))


async def list_jobs(call: Caller, after: str | None, limit: int, order: PageOrder) -> Response:
    svc = call.service
    # An empty ``after=`` (what some clients send for "no cursor") is no cursor.
    listing = await svc.state.blocking(svc.page, call.owner, after or None, limit, order)
    return json_response(listing)


async def retrieve_job(
    request: Request, job_id: str, caller: Callable[[Request], Awaitable[Caller]]
) -> Response:
    # The caller is resolved here rather than by a dependency: FastAPI's solving of
    # even one sub-dependency (its cache key, scope and generator checks) was ~8% of
    # a status read, the most frequent request. Nothing in the route's parameters
    # can fail validation (the path matched), so a missing key still answers 401.
    call = await caller(request)
    svc = call.service
    return _object(svc, await svc.state.blocking(svc.retrieve, job_id, call.owner))


async def delete_job(call: Caller, job_id: str, deleted: type[BaseModel]) -> Response:
    """Delete the job and its objects; ``deleted``: the kind's answer (``VideoDeleted``)."""
    svc = call.service
    # S3 deletes: on the S3 pool, so a stalled S3 cannot starve database reads
    await svc.state.artifacts.run(svc.delete, job_id, call.owner)
    return json_response(deleted(id=job_id))


async def cancel_job(call: Caller, job_id: str) -> Response:
    svc = call.service
    return _object(svc, await svc.state.blocking(svc.cancel, job_id, call.owner))
