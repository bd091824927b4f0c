"""What every kind of job shares as the API sees it: store + enqueue, read, page, cancel,
delete, content lookup, and waiting for the end (the ``sync`` endpoints).

:class:`api.videos_service.VideoService` and :class:`api.audio_service.AudioService` add
their request validation and wire objects on top; ``api/routes/jobs.py`` serves either
through the same routes. Methods are blocking (database, S3) and run in the thread pool,
except the ``async`` ones.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import anyio
from fastapi import Request, Response
from pydantic import BaseModel
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool

from api.content import stream_artifact
from api.metrics import JOBS_CREATED
from api.payload import storable
from api.state import AppState
from models.common import JobError, StageDurations
from models.db import Artifact, Job, JobStatus, JobView, job_spec
from models.errors import (
    Gone,
    InvalidRequest,
    JobFailed,
    NotFound,
    NotReady,
    ServiceUnavailable,
    SyncTimeout,
)
from models.events import DoneEvent, StatusEvent
from storage.artifacts import StorageError
from storage.bus import BusUnavailable
from storage.constants import job_events_key, job_prefix
from storage.webhooks import check_destination

log = logging.getLogger(__name__)

# How long a ``sync`` wait listens to a quiet event stream before it reads the job's row.
ROW_CHECK_MS = 15_000


class ClientGone(Exception):
    """The client of a ``sync`` request disconnected; its job was cancelled."""


WireT = TypeVar("WireT")


class JobService(abc.ABC, Generic[WireT]):
    kind = "video"
    noun = "video"  # in error messages
    id_param = "video_id"

    def __init__(self, state: AppState, *, max_active_jobs: int = 0) -> None:
        """``max_active_jobs``: the creating key's limit of queued + running jobs
        (0: none), checked by :meth:`insert` (``api/admission.py`` sets it)."""
        self.state = state
        self.settings = state.settings
        self.max_active_jobs = max_active_jobs

    # ---- create -----------------------------------------------------------------

    @abc.abstractmethod
    async def create(
        self, raw: dict[str, Any], upload: bytes | None, owner: str, idempotency_key: str | None
    ) -> WireT:
        """Validate the raw create body, store and enqueue the job; its wire object."""

    def store(
        self,
        job: Job,
        idempotency_key: str | None,
        before_insert: Callable[[], None] | None = None,
    ) -> tuple[Job, bool, int | None]:
        """:meth:`insert`, then the stored job's queue position, read in the same
        thread-pool call (one hop per create instead of two)."""
        stored, created = self.insert(job, idempotency_key, before_insert)
        return stored, created, self.state.jobs.queue_positions([stored]).get(stored.id)

    def insert(
        self,
        job: Job,
        idempotency_key: str | None,
        before_insert: Callable[[], None] | None = None,
    ) -> tuple[Job, bool]:
        """Insert ``job`` and enqueue it; the owner's job with the same idempotency key
        (within the window) instead, if there is one. ``before_insert`` stores inputs
        under the job's prefix; whatever fails, nothing is left behind. A ``webhook_url``
        the URL guard refuses is a 400 before any of it. The key's ``max_active_jobs`` is
        checked after the idempotency lookup (a retried create gets its job) and before
        anything is stored."""
        jobs = self.state.jobs
        window = self.settings.idempotency_ttl_s
        prefix = job_prefix(job.kind, job.id)
        hook = job_spec(job).webhook
        if hook is not None:  # the URL guard (DNS): here, in the thread pool, before storing
            check_destination(hook.url, self.settings.webhooks, "webhook_url")
        if idempotency_key:
            existing = jobs.find_idempotent(job.owner, idempotency_key, window)
            if existing is not None:
                return _same_kind(existing, job), False
        if self.max_active_jobs:
            self.state.quotas.check_active(jobs, job.owner, self.max_active_jobs)
        if before_insert is not None:
            try:
                before_insert()
            except StorageError as exc:
                raise ServiceUnavailable(
                    "object storage is unavailable", code="storage_error"
                ) from exc
        try:
            stored, created = jobs.create(job, idempotency_window_s=window)
        except Exception:
            self._drop_objects(prefix)
            raise
        if not created:  # lost an idempotency race: ours is not needed
            self._drop_objects(prefix)
            return _same_kind(stored, job), False
        try:
            self.state.queue.enqueue(job.id, job.model)
        except Exception as exc:
            jobs.delete(job.id)
            self._drop_objects(prefix)
            raise ServiceUnavailable("the job broker is unavailable", code="broker_error") from exc
        JOBS_CREATED.labels(job.model, job.kind).inc()
        return stored, True

    async def announce(self, job: Job, created: bool, position: int | None) -> None:
        """A new job's first ``status`` event."""
        if created:
            event = StatusEvent(status="queued", queue_position=position)
            timeout = self.settings.redis.command_timeout_s
            try:  # the job is stored and enqueued; watchers fall back to its row
                await self.state.abus.publish(job_events_key(job.id), event, timeout_s=timeout)
            except BusUnavailable:
                log.warning("could not publish the first status of %s", job.id)

    def _drop_objects(self, prefix: str) -> None:
        try:
            self.state.artifacts.delete_prefix(prefix)
        except StorageError:
            log.warning("could not delete %s; the reconciler will", prefix)

    # ---- read -------------------------------------------------------------------

    def get_job(self, job_id: str, owner: str) -> JobView:
        job = self.state.jobs.read(job_id, owner) if storable(job_id) else None
        if job is None or job.kind != self.kind:
            raise NotFound(f"no {self.noun} with id {job_id!r}", param=self.id_param)
        return job

    def page_rows(
        self, owner: str, after: str | None, limit: int, order: str
    ) -> tuple[Sequence[JobView], bool, dict[str, int]]:
        if after is not None and not storable(after):
            raise InvalidRequest(f"after: no {self.noun} with id {after!r}", param="after")
        try:
            rows, has_more = self.state.jobs.page(
                owner, after=after, limit=limit, order=order, kind=self.kind
            )
        except KeyError as exc:
            raise InvalidRequest(f"after: no {self.noun} with id {after!r}", param="after") from exc
        return rows, has_more, self.state.jobs.queue_positions(rows)

    def retrieve(self, job_id: str, owner: str) -> WireT:
        job = self.get_job(job_id, owner)
        positions = self.state.jobs.queue_positions([job])
        return self.to_wire(job, positions.get(job.id))

    def page_fields(self, owner: str, after: str | None, limit: int, order: str) -> dict[str, Any]:
        """``data``, ``first_id``, ``last_id``, ``has_more`` of a list page."""
        rows, has_more, positions = self.page_rows(owner, after, limit, order)
        data = [self.to_wire(j, positions.get(j.id)) for j in rows]
        return {
            "data": data,
            "first_id": rows[0].id if rows else None,
            "last_id": rows[-1].id if rows else None,
            "has_more": has_more,
        }

    @abc.abstractmethod
    def page(self, owner: str, after: str | None, limit: int, order: str) -> BaseModel:
        """A list page of the owner's jobs of this kind (:meth:`page_fields` as the
        kind's page model)."""

    # ---- wire -------------------------------------------------------------------

    @abc.abstractmethod
    def to_wire(self, job: JobView, queue_position: int | None = None) -> WireT:
        """The job as its wire object (``video`` / ``audio``)."""

    @abc.abstractmethod
    def content_headers(self, job: JobView) -> dict[str, str]:
        """Headers of the artifact's response, besides the object's own."""

    @abc.abstractmethod
    def filename(self, job: JobView, variant: str) -> str:
        """The download name of a presigned URL of the ``variant`` artifact."""

    @staticmethod
    def wire_fields(job: JobView, queue_position: int | None) -> dict[str, Any]:
        """The fields every job object shares (status, progress, times, error, …)."""
        error = None
        if job.status == JobStatus.FAILED:
            error = JobError(
                code=job.error_code or "internal_error",
                message=job.error_message or "the job failed",
            )
        return {
            "id": job.id,
            "model": job.model,
            "status": job.status,
            "progress": job.progress,
            "created_at": int(job.created_at),
            "started_at": epoch(job.started_at),
            "completed_at": epoch(job.completed_at),
            "expires_at": epoch(job.expires_at),
            "prompt": job.prompt,
            "seed": job.seed,
            "num_inference_steps": job.num_inference_steps,
            "step": job.step,
            "stage": job.stage,
            "error": error,
            "queue_position": queue_position if job.status == JobStatus.QUEUED else None,
            "inference_time_s": job.inference_time_s,
            "stage_durations": StageDurations(**(job.stage_durations or {})),
            "peak_memory_mb": job.peak_memory_mb,
            "attempt": job.attempt,
        }

    # ---- cancel / delete --------------------------------------------------------

    def cancel(self, job_id: str, owner: str) -> WireT:
        """Cancel a queued or running job; a finished job is returned unchanged."""
        job = self.get_job(job_id, owner)
        self.cancel_job(job.id, "cancelled by the client")
        return self.retrieve(job_id, owner)

    def cancel_job(self, job_id: str, message: str) -> bool:
        """Fail the job with ``cancelled`` if it is still active, and tell its watchers.
        The worker notices at its next step boundary and cleans up."""
        if not self.state.jobs.cancel(job_id, message):
            return False
        error = JobError(code="cancelled", message=message)
        try:
            self.state.bus.publish(job_events_key(job_id), DoneEvent(status="failed", error=error))
        except Exception:  # the row is the truth; watchers also poll it
            log.warning("could not publish the cancel of %s", job_id, exc_info=True)
        return True

    def delete(self, job_id: str, owner: str) -> None:
        """Cancel if active, delete every object under the job's prefix, then the record."""
        job = self.get_job(job_id, owner)
        self.cancel_job(job.id, "deleted by the client")
        try:
            self.state.artifacts.delete_prefix(job_prefix(job.kind, job.id))
        except StorageError as exc:
            raise ServiceUnavailable(
                f"object storage is unavailable; the {self.noun} was cancelled, retry the delete",
                code="storage_error",
            ) from exc
        self.state.jobs.delete(job.id)
        try:
            self.state.bus.delete(job_events_key(job.id))
        except RedisError:  # the stream expires with its TTL
            log.warning("could not delete the event stream of %s", job.id)

    def content_artifact(self, job_id: str, owner: str, variant: str) -> tuple[JobView, Artifact]:
        """The job and its ``variant`` artifact, read in one statement (404/410 as for
        content: :meth:`servable`)."""
        job, artifact = self.job_and_artifact(job_id, owner, variant)
        return job, self.servable(job, artifact, variant)

    def job_and_artifact(
        self, job_id: str, owner: str, variant: str
    ) -> tuple[JobView, Artifact | None]:
        """The owner's job of this kind (404 otherwise) and its ``variant`` artifact row,
        if there is one, in one round trip."""
        jobs = self.state.jobs
        found = jobs.read_with_artifact(job_id, owner, variant) if storable(job_id) else None
        if found is None or found[0].kind != self.kind:
            raise NotFound(f"no {self.noun} with id {job_id!r}", param=self.id_param)
        return found

    def servable(self, job: JobView, artifact: Artifact | None, variant: str) -> Artifact:
        """``artifact`` if the job's content can be served: 404 ``not_ready`` before the
        job completed, 410 once it expired, 404 without the ``variant``."""
        job_id = job.id
        if job.status != JobStatus.COMPLETED:
            raise NotReady(
                f"{self.noun} {job_id} is {job.status}; content is available once it is completed",
                param=self.id_param,
            )
        if job.expires_at is not None and job.expires_at <= time.time():
            raise Gone(f"the content of {self.noun} {job_id} has expired", param=self.id_param)
        if artifact is None:
            raise NotFound(f"{self.noun} {job_id} has no {variant!r} variant", param="variant")
        return artifact

    # ---- sync -------------------------------------------------------------------

    async def wait_done(
        self, request: Request, job_id: str, owner: str, variant: str
    ) -> tuple[JobView, Artifact | None]:
        """Wait for the job to end by following its event stream; cancel it when the
        client disconnects (:class:`ClientGone`) or the sync timeout passes (504). A
        failed job raises. The ended job's row and its ``variant`` artifact.

        The stream is read from its start, so a ``done`` published before this call is
        seen at once; the row is read when the job has ended, and when the stream was
        quiet for :data:`ROW_CHECK_MS` (a ``done`` lost to a Redis blip, or expired)."""
        gone = False
        error: Exception | None = None
        with anyio.move_on_after(self.settings.sync_timeout_s) as timer:
            async with anyio.create_task_group() as tg:

                async def watch_client() -> None:
                    nonlocal gone
                    await _disconnected(request)
                    gone = True
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_client)
                try:
                    job, artifact = await self._until_ended(job_id, owner, variant)
                except Exception as exc:  # raised below, not wrapped in an ExceptionGroup
                    error = exc
                tg.cancel_scope.cancel()
        if error is not None:
            raise error
        if gone:
            await self.cancel_quietly(job_id, "client disconnected")
            raise ClientGone(job_id)
        if timer.cancelled_caught:
            await self.cancel_quietly(job_id, "sync timeout")
            raise SyncTimeout(
                f"{self.noun} {job_id} did not finish within "
                f"{self.settings.sync_timeout_s:g} s and was cancelled",
                param="timeout",
            )
        if job.status == JobStatus.FAILED:
            raise JobFailed(
                f"{self.noun} {job_id} failed: {job.error_message or 'the job failed'}",
                code=job.error_code or "internal_error",
            )
        return job, artifact

    async def file_when_done(
        self,
        request: Request,
        job_id: str,
        owner: str,
        variant: str,
        extra_headers: Callable[[JobView], Mapping[str, str]] | None = None,
    ) -> Response:
        """What a ``sync`` endpoint answers: the job's ``variant`` artifact once it ends,
        with ``X-Request-Id`` and ``X-Inference-Time-S`` (and ``extra_headers(job)``); 499
        when the client left. A failed or timed-out job raises (:meth:`wait_done`)."""
        try:
            job, found = await self.wait_done(request, job_id, owner, variant)
        except ClientGone:
            return Response(status_code=499)
        artifact = self.servable(job, found, variant)
        headers = {
            "X-Request-Id": job_id,
            "X-Inference-Time-S": f"{job.inference_time_s or 0.0:.3f}",
            **(extra_headers(job) if extra_headers is not None else {}),
        }
        return await stream_artifact(self.state.artifacts, artifact, None, headers, self.id_param)

    async def _until_ended(
        self, job_id: str, owner: str, variant: str
    ) -> tuple[JobView, Artifact | None]:
        """The job's row (and its ``variant`` artifact, in the same statement and
        thread-pool call) once its stream says ``done`` or the row says it ended. The
        first read does not wait: an empty stream (expired, or the job ended long ago)
        sends us to the row at once."""
        read = self.job_and_artifact
        stream = job_events_key(job_id)
        after = "0-0"
        block_ms: int | None = None
        while True:
            try:
                entries = await self.state.abus.read(stream, after, block_ms=block_ms)
            except RedisError:
                log.warning("cannot follow %s on the bus; reading its row", job_id)
                entries = []
                await anyio.sleep(1.0)
            if any(entry.type == "done" for entry in entries):
                return await self.state.blocking(read, job_id, owner, variant)
            if entries:
                after = entries[-1].id
            else:
                found = await self.state.blocking(read, job_id, owner, variant)
                if found[0].status in (JobStatus.COMPLETED, JobStatus.FAILED):
                    return found
            block_ms = ROW_CHECK_MS

    async def cancel_quietly(self, job_id: str, message: str) -> None:
        """Cancel from a cleanup path, even while the surrounding task is being cancelled."""
        with anyio.CancelScope(shield=True):
            try:
                await run_in_threadpool(self.cancel_job, job_id, message)
            except Exception:
                log.warning("could not cancel %s", job_id, exc_info=True)


async def _disconnected(request: Request) -> None:
    """Return once the client of ``request`` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def epoch(value: float | None) -> int | None:
    return None if value is None else int(value)


def _same_kind(existing: Job, job: Job) -> Job:
    """The job an ``Idempotency-Key`` already names, when it is of the kind being created;
    a key first used for a video job cannot answer an audio create (or the reverse)."""
    if existing.kind != job.kind:
        raise InvalidRequest(
            f"this Idempotency-Key was used for a {existing.kind} job; use a new key",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return existing
