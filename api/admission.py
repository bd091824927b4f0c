"""The one dependency of every job create route: the caller, its quotas, and the
create's rate-limit check, before the body is even read (``api/quotas.py``).

A create that passes gets its ``x-ratelimit-*`` headers on whatever the route answers
(:meth:`Admitted.answer`), and on an error raised later in the request (they are kept on
``request.state`` for the error handlers, ``api/errors.py``). Its service carries the
key's ``max_active_jobs``, checked where the job is stored
(:meth:`api.jobs_service.JobService.insert`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Depends, Request
from fastapi.responses import Response

from api.deps import authenticate_key
from api.errors import RATELIMIT_STATE
from api.jobs_service import JobService
from api.state import AppState
from storage.constants import LOCAL_OWNER

S = TypeVar("S", bound=JobService[Any, Any])


@dataclass(frozen=True, slots=True)
class Admitted(Generic[S]):
    """A create that may go on: the kind's service (with the key's active-job limit),
    the caller's key id (``local`` while auth is off) and the answer's headers."""

    service: S
    owner: str
    headers: dict[str, str]

    def answer(self, response: Response) -> Response:
        """``response`` with the create's ``x-ratelimit-*`` headers."""
        if self.headers:
            response.headers.update(self.headers)
        return response


def admit(cls: type[S]) -> Callable[[Request], Awaitable[Admitted[S]]]:
    """Authenticate (401), count the create against the key's creates per minute
    (429 ``creates_per_minute``) and build the kind's service."""

    async def admitted(request: Request) -> Admitted[S]:
        state: AppState = request.state.app
        key = await authenticate_key(request, state)
        owner = LOCAL_OWNER if key is None else key.id
        limits = state.quotas.limits_for(key)
        headers = await state.quotas.admit_create(owner, limits)
        if headers:
            setattr(request.state, RATELIMIT_STATE, headers)
        return Admitted(cls(state, max_active_jobs=limits.max_active_jobs), owner, headers)

    return admitted


def admission(cls: type[JobService[Any, Any]]) -> Any:
    """``Depends(…)`` of :func:`admit` (``call: Annotated[Admitted[VideoService],
    admission(VideoService)]``)."""
    return Depends(admit(cls))
