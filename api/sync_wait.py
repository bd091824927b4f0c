"""The HTTP side of the ``sync`` endpoints (``POST /v1/videos/sync``, ``/v1/audio/speech``,
``/v1/audio/generate``): wait for a job to end while its client is still connected,
cancel it when the client leaves or the sync timeout passes, then answer with its file.

The job logic (reads, cancel, what content is servable) is the kind's
:class:`api.jobs_service.JobService`; this module owns what only an HTTP request has: its
disconnect, its deadline, and the response.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from fastapi import Request, Response
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool

from api.content import stream_artifact
from api.jobs_service import JobService
from models.db import Artifact, JobStatus, JobView
from models.errors import JobFailed, SyncTimeout
from storage.constants import job_events_key

log = logging.getLogger(__name__)

# How long a ``sync`` wait listens to a quiet event stream before it reads the job's row.
ROW_CHECK_MS = 15_000


class ClientGone(Exception):
    """The client of a ``sync`` request disconnected; its job was cancelled."""


async def wait_done(
    service: JobService[Any, Any], request: Request, job_id: str, owner: str, variant: str
) -> tuple[JobView, Artifact | None]:
    """Wait for the job to end by following its event stream; cancel it when the
    client disconnects (:class:`ClientGone`) or the sync timeout passes (504). A
    failed job raises. The ended job's row and its ``variant`` artifact.

    The stream is read from its start, so a ``done`` published before this call is
    seen at once; the row is read when the job has ended, and when the stream was
    quiet for :data:`ROW_CHECK_MS` (a ``done`` lost to a Redis blip, or expired)."""
    timeout_s = service.settings.sync_timeout_s
    gone = False
    error: Exception | None = None
    with anyio.move_on_after(timeout_s) as timer:
        async with anyio.create_task_group() as tg:

            async def watch_client() -> None:
                nonlocal gone
                await _disconnected(request)
                gone = True
                tg.cancel_scope.cancel()

            tg.start_soon(watch_client)
            try:
                job, artifact = await _until_ended(service, job_id, owner, variant)
            except Exception as exc:  # raised below, not wrapped in an ExceptionGroup
                error = exc
            tg.cancel_scope.cancel()
    if error is not None:
        raise error
    if gone:
        await cancel_quietly(service, job_id, "client disconnected")
        raise ClientGone(job_id)
    if timer.cancelled_caught:
        await cancel_quietly(service, job_id, "sync timeout")
        raise SyncTimeout(
            f"{service.noun} {job_id} did not finish within {timeout_s:g} s and was cancelled",
            param="timeout",
        )
    if job.status == JobStatus.FAILED:
        raise JobFailed(
            f"{service.noun} {job_id} failed: {job.error_message or 'the job failed'}",
            code=job.error_code or "internal_error",
        )
    return job, artifact


async def file_when_done(
    service: JobService[Any, Any],
    request: Request,
    job_id: str,
    owner: str,
    variant: str,
    extra_headers: Callable[[JobView], Mapping[str, str]] | None = None,
) -> Response:
    """What a ``sync`` endpoint answers: the job's ``variant`` artifact once it ends,
    with ``X-Request-Id`` and ``X-Inference-Time-S`` (and ``extra_headers(job)``); 499
    when the client left. A failed or timed-out job raises (:func:`wait_done`)."""
    try:
        job, found = await wait_done(service, request, job_id, owner, variant)
    except ClientGone:
        return Response(status_code=499)
    artifact = service.servable(job, found, variant)
    headers = {
        "X-Request-Id": job_id,
        "X-Inference-Time-S": f"{job.inference_time_s or 0.0:.3f}",
        **(extra_headers(job) if extra_headers is not None else {}),
    }
    return await stream_artifact(service.state.artifacts, artifact, None, headers, service.id_param)


async def cancel_quietly(service: JobService[Any, Any], job_id: str, message: str) -> None:
    """Cancel from a cleanup path, even while the surrounding task is being cancelled."""
    with anyio.CancelScope(shield=True):
        try:
            await run_in_threadpool(service.cancel_job, job_id, message)
        except Exception:
            log.warning("could not cancel %s", job_id, exc_info=True)


async def _until_ended(
    service: JobService[Any, Any], job_id: str, owner: str, variant: str
) -> tuple[JobView, Artifact | None]:
    """The job's row (and its ``variant`` artifact, in the same statement and
    thread-pool call) once its stream says ``done`` or the row says it ended. The
    first read does not wait: an empty stream (expired, or the job ended long ago)
    sends us to the row at once."""
    read, state = service.job_and_artifact, service.state
    stream = job_events_key(job_id)
    after = "0-0"
    block_ms: int | None = None
    while True:
        try:
            entries = await state.abus.read(stream, after, block_ms=block_ms)
        except RedisError:
            log.warning("cannot follow %s on the bus; reading its row", job_id)
            entries = []
            await anyio.sleep(1.0)
        if any(entry.type == "done" for entry in entries):
            return await state.blocking(read, job_id, owner, variant)
        if entries:
            after = entries[-1].id
        else:
            found = await state.blocking(read, job_id, owner, variant)
            if found[0].status in (JobStatus.COMPLETED, JobStatus.FAILED):
                return found
        block_ms = ROW_CHECK_MS


async def _disconnected(request: Request) -> None:
    """Return once the client of ``request`` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
