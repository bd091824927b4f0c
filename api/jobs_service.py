"""What every kind of job shares as the API sees it: store + enqueue, read, page, cancel,
delete, and content lookup.

:class:`api.videos_service.VideoService` and :class:`api.audio_service.AudioService` add
their request resolution and wire objects on top; the routes of either
(``api/routes/videos.py``, ``api/routes/audio.py``) share their bodies
(``api/routes/jobs.py``, ``api/routes/job_output.py``). A service takes its kind's
parsed create request (the route parses the body: ``api/create_requests.py``) and knows
nothing of HTTP: waiting for a ``sync`` request's job is ``api/sync_wait.py``. Methods
are blocking (database, S3) and run in the thread pool, except the ``async`` ones.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from redis.exceptions import RedisError

from api.errors import broker_unavailable
from api.metrics import JOBS_CREATED
from api.payload import storable
from api.state import AppState
from models.applied import applied_params
from models.common import JobError, StageDurations
from models.db import Artifact, Job, JobStatus, JobView, job_spec
from models.errors import (
    ErrorCode,
    Gone,
    InvalidRequest,
    NotFound,
    NotReady,
    ServiceUnavailable,
)
from models.events import DoneEvent, StatusEvent
from storage.artifacts import StorageError, try_delete_prefix
from storage.constants import job_events_key, job_prefix
from storage.webhooks import check_destination

log = logging.getLogger(__name__)

WireT = TypeVar("WireT")
RequestT = TypeVar("RequestT")


class JobService(abc.ABC, Generic[WireT, RequestT]):
    """A job kind's service: ``WireT`` its wire object, ``RequestT`` its parsed create
    request."""

    # The kind's name: its jobs' ``kind`` and its noun in error messages; its path
    # parameter is ``{kind}_id`` (set for each subclass).
    kind = "video"
    noun = "video"
    id_param = "video_id"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.noun, cls.id_param = cls.kind, f"{cls.kind}_id"

    def __init__(self, state: AppState, *, max_active_jobs: int = 0) -> None:
        """``max_active_jobs``: the creating key's limit of queued + running jobs
        (0: none), checked by :meth:`insert` (``api/admission.py`` sets it)."""
        self.state = state
        self.settings = state.settings
        self.max_active_jobs = max_active_jobs

    # ---- create -----------------------------------------------------------------

    @abc.abstractmethod
    async def create(self, request: RequestT, owner: str, idempotency_key: str | None) -> WireT:
        """Resolve the parsed create request against the served models and the limits,
        store and enqueue the job; its wire object."""

    def store(
        self,
        job: Job,
        idempotency_key: str | None,
        before_insert: Callable[[], None] | None = None,
    ) -> tuple[Job, bool, int | None]:
        """:meth:`insert`, the stored job's queue position, its first ``status`` event,
        then the broker, all in one thread-pool call (one hop per create). The ``queued``
        event is on the job's stream before the job is on the broker, so no worker's
        ``in_progress`` can come before it."""
        stored, created = self.insert(job, idempotency_key, before_insert)
        position = self.state.jobs.queue_positions([stored]).get(stored.id)
        if position is not None:  # here, in the thread pool: the wire object reads it
            self.state.queue_bound.estimates.figures(stored.model)
        if created:
            self._dispatch(stored, position)
        elif stored.status == JobStatus.QUEUED:
            self._redispatch(stored)
        return stored, created, position

    def insert(
        self,
        job: Job,
        idempotency_key: str | None,
        before_insert: Callable[[], None] | None = None,
    ) -> tuple[Job, bool]:
        """Insert ``job`` and enqueue it; the owner's job with the same idempotency key
        (within the window) instead, if there is one. ``before_insert`` stores inputs
        under the job's prefix; whatever fails, nothing is left behind. A ``webhook_url``
        the URL guard refuses is a 400 before any of it. After the idempotency lookup (a
        retried create gets its job) and before anything is stored: the model must be one
        a live worker can load (503 ``model_unavailable``: ``api/model_availability.py``),
        then the key's ``max_active_jobs``, then the model's queue bound
        (``api/queue_admission.py``)."""
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
        self.state.availability.check(job.model)  # 503 model_unavailable
        if self.max_active_jobs:
            self.state.quotas.check_active(jobs, job.owner, self.max_active_jobs)
        self.state.queue_bound.admit(job)  # the model's default ttl; 429 queue_full
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
            try_delete_prefix(self.state.artifacts, prefix)
            raise
        if not created:  # lost an idempotency race: ours is not needed
            try_delete_prefix(self.state.artifacts, prefix)
            return _same_kind(stored, job), False
        return stored, True

    def _dispatch(self, job: Job, position: int | None) -> None:
        """The stored job's first ``status`` event, then the job on the broker. One Redis
        serves both (``OMNIQ_REDIS__URL``): when the event cannot be published the broker
        is not tried (a stalled Redis costs one timeout, not four), and either failure
        refuses the create (503 ``broker_error``) with nothing of it left."""
        eta = self.state.queue_bound.estimates.estimated_start_at(job.model, position)
        event = StatusEvent(status="queued", queue_position=position, estimated_start_at=eta)
        published = False
        try:
            published = bool(self.state.bus.publish(job_events_key(job.id), event))
            self.state.queue.enqueue(job.id, job.model)
        except Exception as exc:
            self.state.jobs.delete(job.id)
            try_delete_prefix(self.state.artifacts, job_prefix(job.kind, job.id))
            try:
                if published:
                    self.state.bus.delete(job_events_key(job.id))
            except RedisError:
                log.warning("could not delete the events of %s", job.id)
            raise broker_unavailable() from exc
        JOBS_CREATED.labels(job.model, job.kind).inc()

    def _redispatch(self, job: Job) -> None:
        """A retried create of a job still queued puts it on the broker again: the first
        create may have stored it and died before enqueueing it (its API host vanished),
        and a queued job with no message would wait for another job's message, or for
        its ``ttl``. A message too many is harmless: claims are conditional, so the extra
        one finds nothing to run and is dropped (under fair share it runs the model's
        next queued job, if any). A failure is 503 ``broker_error``; the job stays, for
        the next retry."""
        try:
            self.state.queue.enqueue(job.id, job.model)
        except Exception as exc:
            raise broker_unavailable() from exc

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

    def wire_fields(self, job: JobView, queue_position: int | None) -> dict[str, Any]:
        """The fields every job object shares (status, progress, times, error, …);
        a queued job's ``estimated_start_at`` (``api/queue_admission.py``)."""
        queued = job.status == JobStatus.QUEUED
        estimates = self.state.queue_bound.estimates
        eta = estimates.estimated_start_at(job.model, queue_position) if queued else None
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
            "queue_position": queue_position if queued else None,
            "estimated_start_at": eta,
            "ttl": job.ttl_s,
            "inference_time_s": job.inference_time_s,
            "stage_durations": StageDurations(**(job.stage_durations or {})),
            "peak_memory_mb": job.peak_memory_mb,
            "attempt": job.attempt,
            "applied_params": applied_params(job.spec, self._parameters(job.model)),
        }

    def _parameters(self, model: str) -> list[str] | None:
        """The declared optional fields of a served model (None: not served now)."""
        spec = self.state.specs.get(model)
        return None if spec is None else spec.parameters

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
        if job.status == JobStatus.FAILED:  # ended without content, for good
            cancelled = job.error_code == ErrorCode.CANCELLED
            what = "was cancelled" if cancelled else f"failed ({job.error_code})"
            raise NotReady(
                f"{self.noun} {job_id} {what} and has no content",
                param=self.id_param,
                code="job_cancelled" if cancelled else "job_failed",
            )
        if job.status != JobStatus.COMPLETED:
            raise NotReady(
                f"{self.noun} {job_id} is {job.status}; content is available once it is completed",
                param=self.id_param,
            )
        if job.expires_at is not None and job.expires_at <= time.time():
            raise Gone(f"the content of {self.noun} {job_id} has expired", param=self.id_param)
        if artifact is None:
            kind, _, index = variant.partition(".")
            if index:  # output k of a job of fewer outputs (models.job_specs.output_variant)
                raise NotFound(f"{self.noun} {job_id} has no output {index}", param="index")
            raise NotFound(f"{self.noun} {job_id} has no {kind!r} variant", param="variant")
        return artifact


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
