"""Which job a job message runs, made ours before it runs: claim, take over, fair share.

A Celery message carries one job id, A. The job it runs, B, is chosen by one rule
(:func:`may_run`, which :meth:`JobClaim.acquire` checks of every job it returns):

* B is A, claimed while queued (``queued → in_progress``, :meth:`JobStore.claim_job`),
  or taken over while running when A's worker stopped heartbeating (attempt + 1,
  bounded; past ``max_attempts`` A fails ``worker_lost`` instead);
* or, under fair share (``quotas.fair_share``), B is the fair next queued job of A's
  model, whoever's it is (:mod:`storage.fair_share`): a message whose job was cancelled
  runs someone else's.

A running job is taken over only by its own message. Every message takes over, claims,
or finds nothing queued, so there are never fewer messages than queued jobs.

Before it claims, a message ends its model's queued jobs whose ``ttl`` passed
(:func:`expire_queued`, which the reconciler also runs on every pass): the claim itself
never takes one (``storage.job_statements.within_ttl``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models.common import JobError, JobStatus
from models.db import Job
from models.errors import ErrorCode
from models.events import DoneEvent
from storage.jobs import JobStore
from storage.settings import Settings
from workers.common import metrics

log = logging.getLogger(__name__)


def expire_queued(
    jobs: JobStore,
    publish: Callable[[Job, Any], object],
    delete_objects: Callable[[Job], object],
    model: str | None = None,
) -> list[str]:
    """End every queued job (of ``model``, or of any) whose ``ttl`` has passed: failed
    ``ttl_expired`` (its webhooks queued by the store), its watchers told, its objects
    (an uploaded reference) deleted. Its message, when a worker gets it, is dropped and
    counts the job in the metrics, as for a job cancelled while queued."""
    ended = jobs.expire_ttl(time.time(), model)
    message = "the job was still queued when its ttl passed"
    error = JobError(code=ErrorCode.TTL_EXPIRED.value, message=message)
    for job_id, kind, of_model in ended:
        job = Job(id=job_id, kind=kind, model=of_model)
        publish(job, DoneEvent(status="failed", error=error))
        delete_objects(job)
    return [job_id for job_id, _, _ in ended]


def may_run(message_job_id: str, message_model: str, job: Job, *, fair_share: bool) -> bool:
    """The rule "job A's message may run job B": ``job`` (B) is the message's own job (A),
    or, under fair share, a job of the message's model."""
    return job.id == message_job_id or (fair_share and job.model == message_model)


@dataclass(eq=False)
class JobClaim:
    """Makes the job a message runs ours (one per worker process, in the executor)."""

    settings: Settings
    jobs: JobStore
    worker_id: str
    # Best-effort event publishing and the deletion of a job's objects: the executor's.
    publish: Callable[[Job, Any], object]
    delete_objects: Callable[[Job], object]

    def acquire(self, job_id: str, model: str) -> Job | None:
        """The job the message of ``job_id`` (for ``model``) runs, now ours; None when
        there is none (A ended or a live worker owns it, and nothing else may run)."""
        fair_share = self.settings.quotas.fair_share
        expire_queued(self.jobs, self.publish, self.delete_objects, model)
        if not fair_share:
            job = self.jobs.claim_job(job_id, self.worker_id)  # the common case: one query
            if job is None:
                job = self._take_over(self.jobs.get(job_id))
        else:
            job = self._take_over(self.jobs.get(job_id))
            if job is None:  # A ended (or was deleted) or is a live worker's
                job = self.jobs.claim_next(model, self.worker_id)
        if job is not None and not may_run(job_id, model, job, fair_share=fair_share):
            raise RuntimeError(f"the message of {job_id} may not run {job.id}")
        return job

    def _take_over(self, job: Job | None) -> Job | None:
        """Take over ``job`` if its worker stopped heartbeating (``worker_lost`` once its
        attempts are used up); None if it ended or a live worker owns it."""
        if job is None or job.status != JobStatus.IN_PROGRESS:
            if job is not None:
                metrics.message_dropped(job)  # counts a job cancelled before any claim
            return None
        job_id = job.id
        w = self.settings.worker
        stale_before = time.time() - w.heartbeat_timeout_s
        if job.heartbeat_at is not None and job.heartbeat_at >= stale_before:
            return None
        if job.attempt >= w.max_attempts:
            message = f"the worker running this job was lost {job.attempt} times"
            if self.jobs.fail(job_id, ErrorCode.WORKER_LOST, message):
                metrics.job_finished(job, JobStatus.FAILED.value, ErrorCode.WORKER_LOST.value)
                error = JobError(code=ErrorCode.WORKER_LOST.value, message=message)
                self.publish(job, DoneEvent(status="failed", error=error))
            self.delete_objects(job)
            return None
        if not self.jobs.take_over(
            job_id, self.worker_id, stale_before=stale_before, max_attempts=w.max_attempts
        ):
            return None
        metrics.TAKEOVERS.labels(job.model).inc()
        log.info("took over job %s (attempt %d)", job_id, job.attempt + 1)
        return self.jobs.get(job_id)
