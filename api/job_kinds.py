"""What differs between the job kinds' route sets (:class:`JobKind`), and the per-kind
dependencies the job routes (``api/routes/jobs.py``, ``api/routes/job_output.py``) share.

The route factories' modules do without ``from __future__ import annotations``: FastAPI
reads the annotations of routes defined inside a function at runtime, and they name
locals (the dependencies made here).
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Path, Request
from pydantic import BaseModel

from api.deps import authenticate
from api.jobs_service import JobService
from api.state import AppState


@dataclass(frozen=True)
class JobKind:
    prefix: str  # ``/v1/videos``
    tag: str
    noun: str  # names the routes: ``create_{noun}``, ``{noun}_content``
    plural: str  # ``list_{plural}``
    service: type[JobService[Any, Any]]
    create: type[BaseModel]  # the create body, as /openapi.json declares it
    # The body's fields and uploaded files → the request the service's ``create`` takes
    # (``api/create_requests.py``).
    parse: Callable[[dict[str, Any], list[bytes]], Any]
    object: type[BaseModel]
    page: type[BaseModel]
    deleted: type[BaseModel]
    media_types: tuple[str, ...]
    content_200: str  # what the content is, for /openapi.json
    # ``?variant=`` of the content route: a dependency returning the variant asked for.
    variant: Callable[..., str]
    content_doc: str | None = None
    events_doc: str | None = None

    @property
    def item(self) -> str:
        """The path of one job: ``/{video_id}``."""
        return f"/{{{self.service.id_param}}}"


@dataclass(frozen=True, slots=True)
class Caller:
    """What a job route gets from its one dependency: the kind's service and the id of
    the API key making the request (``local`` while auth is off)."""

    service: JobService[Any, Any]
    owner: str


def caller_of(kind: JobKind) -> Callable[[Request], Awaitable[Caller]]:
    """The kind's service and the API key of a request (401 without a live key)."""
    cls = kind.service

    async def caller(request: Request) -> Caller:
        state: AppState = request.state.app
        return Caller(cls(state), await authenticate(request, state))

    return caller


def caller_dep(kind: JobKind) -> Any:
    """``Depends(…)`` of the kind's :class:`Caller` (route parameters say
    ``call: Annotated[Caller, caller_dep(kind)]``). One dependency instead of a service
    and an owner that both depended on the state: FastAPI solved five dependency levels
    per request, a fifth of a status read's CPU."""
    return Depends(caller_of(kind))


def job_id_param(kind: JobKind) -> Any:
    """The job id path parameter under its wire name (``video_id``, ``audio_id``):
    ``job_id: Annotated[str, job_id_param(kind)]``."""
    return Path(alias=kind.service.id_param)
