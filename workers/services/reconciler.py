"""The reconciler: periodic, idempotent repair of what crashes and time leave behind.

Each pass (run by every worker's background thread; a Redis lock lets one worker at a
time do it) does four things, each safe to repeat and to race with the executor because
every change is a conditional UPDATE or an idempotent delete:

1. **Lost workers.** A job ``in_progress`` whose heartbeat lapsed is re-enqueued (the
   worker that gets it takes it over, attempt + 1), or failed with ``worker_lost`` once
   it used up its attempts; its partial objects are deleted.
2. **Expiry.** A completed job past ``expires_at`` loses its objects and artifact rows;
   its content then answers 410. A queued job past its ``ttl`` ends ``ttl_expired``
   (:func:`workers.jobs.claim.expire_queued`).
3. **Stale multipart uploads** older than ``stale_upload_s`` are aborted. And a **lost
   message**: a job queued ``lost_message_after_s`` while its model's broker queue is
   empty is put on the broker again.
4. **Unavailable models.** The queued jobs of a model that no live worker serves and
   whose workers recorded that they cannot load it (``storage/worker_presence.py``)
   fail ``model_unavailable`` with the workers' reasons (:meth:`Reconciler.fail_unavailable`;
   a worker that loaded nothing runs it once on its way out).
5. **Redis keys** of the reconciler itself carry TTLs; nothing else to trim yet.

Besides, every worker sweeps its own machine's temp directory before each pass
(:meth:`workers.jobs.temp_dirs.TempDirs.sweep`): a worker killed mid-job cannot remove its
job's directory itself.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import LockError

from models.common import JobError, JobStatus
from models.db import Job
from models.errors import ErrorCode, model_unavailable_message
from models.events import DoneEvent
from storage.artifacts import ArtifactStore, StorageError, try_delete_prefix
from storage.bus import EventBus
from storage.constants import KEY_PREFIX, job_events_key, job_prefix, job_queue
from storage.jobs import JobStore
from storage.queue import JobQueue
from storage.settings import Settings
from storage.worker_presence import WorkerPresence
from workers.common.metrics import job_finished
from workers.jobs.claim import expire_queued
from workers.jobs.temp_dirs import TempDirs

log = logging.getLogger(__name__)

LOCK_KEY = KEY_PREFIX + "reconciler:lock"
REQUEUED_KEY = KEY_PREFIX + "reconciler:requeued:"
REDISPATCHED_KEY = KEY_PREFIX + "reconciler:redispatched:"
ARTIFACT_PREFIXES = ("videos/", "audios/")


@dataclass
class ReconcileReport:
    requeued: list[str] = field(default_factory=list)
    redispatched: list[str] = field(default_factory=list)
    worker_lost: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    ttl_expired: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    aborted_uploads: int = 0


@dataclass(eq=False, repr=False)
class Reconciler:
    """Repairs what crashed workers and expired jobs leave behind, one locked pass at a
    time (``run_once``)."""

    settings: Settings
    jobs: JobStore
    artifacts: ArtifactStore
    queue: JobQueue
    redis: Any
    bus: EventBus = field(init=False)
    presence: WorkerPresence = field(init=False)

    def __post_init__(self) -> None:
        self.bus = EventBus(self.redis, ttl_s=self.settings.events_ttl_s)
        self.presence = WorkerPresence(self.redis)

    def run_once(self) -> ReconcileReport | None:
        """One pass, or None when another worker holds the lock."""
        # A holder that died mid-pass blocks passes this long; every step is idempotent,
        # so a pass that outlives it and races the next one does no harm.
        ttl = max(int(self.settings.worker.reconcile_interval_s * 3), 10)
        # redis-py's Lock: a random token per holder, released by a Lua script that deletes
        # the key only while it still holds our token (no GET-then-DELETE window).
        lock = self.redis.lock(LOCK_KEY, timeout=ttl, blocking=False)
        if not lock.acquire():
            return None
        try:
            report = ReconcileReport()
            self._lost_messages(report)
            self._lost_workers(report)
            report.ttl_expired = expire_queued(self.jobs, self._publish, self._delete_job)
            report.unavailable = self.fail_unavailable()
            self._expire(report)
            self._stale_uploads(report)
            return report
        finally:
            try:
                lock.release()
            except LockError:  # it expired during the pass; another worker may hold it now
                log.warning("reconciler lock expired before the pass ended (ttl %d s)", ttl)

    def _lost_workers(self, report: ReconcileReport) -> None:
        w = self.settings.worker
        now = time.time()
        for job in self.jobs.stale_running(now - w.heartbeat_timeout_s):
            if job.attempt >= w.max_attempts:
                message = f"the worker running this job was lost {job.attempt} times"
                if self.jobs.fail(job.id, ErrorCode.WORKER_LOST, message):
                    job_finished(job, JobStatus.FAILED.value, ErrorCode.WORKER_LOST.value)
                    report.worker_lost.append(job.id)
                    self._delete_job(job)
                    error = JobError(code=ErrorCode.WORKER_LOST.value, message=message)
                    self.bus.publish(
                        job_events_key(job.id), DoneEvent(status="failed", error=error)
                    )
                continue
            # One re-enqueue per heartbeat window, however often the reconciler runs.
            marker = REQUEUED_KEY + job.id
            if self.redis.set(marker, 1, nx=True, ex=int(w.heartbeat_timeout_s) + 1):
                self.queue.enqueue(job.id, job.model)
                report.requeued.append(job.id)

    def _lost_messages(self, report: ReconcileReport) -> None:
        """A queued job whose broker message is gone (a broker restarted without its
        data, a message lost in transit) would wait for another job's message, or for
        its ``ttl``. While a model's queue holds no message at all, each of its jobs
        queued for ``lost_message_after_s`` is put on the broker again, once per that
        window. A message too many is harmless: claims are conditional."""
        after = self.settings.worker.lost_message_after_s
        if after <= 0:
            return
        empty: dict[str, bool] = {}
        for job in self.jobs.queued_before(time.time() - after):
            queue = job_queue(job.model)
            if queue not in empty:
                empty[queue] = self.redis.llen(queue) == 0
            if empty[queue] and self.redis.set(
                REDISPATCHED_KEY + job.id, 1, nx=True, ex=max(int(after), 1)
            ):
                self.queue.enqueue(job.id, job.model)
                report.redispatched.append(job.id)
        if report.redispatched:
            log.warning("queued with no broker message, put on it again: %s", report.redispatched)

    def fail_unavailable(self) -> list[str]:
        """Fail ``model_unavailable`` the queued jobs of every model that no live worker
        serves while workers recorded that they cannot load it (their reasons are the
        message); the ids. Each model is one conditional UPDATE of its queued jobs: a job
        claimed meanwhile is not touched. A worker still loading the model when the others
        have failed it does not count: it serves nothing yet."""
        queued = list(self.jobs.queue_stats())
        if not queued:
            return []
        failed: list[str] = []
        for model, availability in self.presence.availability(queued).items():
            if availability.reason is None:
                continue
            message = model_unavailable_message(model, availability.reason)
            code = ErrorCode.MODEL_UNAVAILABLE
            error = JobError(code=code.value, message=message)
            for job_id, kind in self.jobs.fail_queued(model, code, message):
                job = Job(id=job_id, kind=kind, model=model)
                job_finished(job, JobStatus.FAILED.value, code.value)
                self._publish(job, DoneEvent(status="failed", error=error))
                self._delete_job(job)
                failed.append(job_id)
        if failed:
            log.warning("failed model_unavailable (no live worker can load the model): %s", failed)
        return failed

    def _expire(self, report: ReconcileReport) -> None:
        for job in self.jobs.expired_with_artifacts(time.time()):
            if self._delete_job(job):
                self.jobs.drop_artifacts(job.id)
                report.expired.append(job.id)

    def _stale_uploads(self, report: ReconcileReport) -> None:
        cutoff = time.time() - self.settings.worker.stale_upload_s
        for prefix in ARTIFACT_PREFIXES:
            try:
                report.aborted_uploads += self.artifacts.abort_uploads(prefix, older_than=cutoff)
            except StorageError:
                log.warning("could not list multipart uploads under %s", prefix)

    def _publish(self, job: Job, event: Any) -> None:
        try:
            self.bus.publish(job_events_key(job.id), event)
        except Exception:  # the row is the truth; watchers also poll it
            log.warning("could not publish the end of %s", job.id, exc_info=True)

    def _delete_job(self, job: Job) -> bool:
        return try_delete_prefix(self.artifacts, job_prefix(job.kind, job.id))


def start_reconciler_thread(
    reconciler: Reconciler, interval_s: float, temp_dirs: TempDirs
) -> threading.Event:
    """Run passes every ``interval_s`` in a daemon thread, each after a sweep of this
    worker's ``temp_dirs``; set the event to stop."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                temp_dirs.sweep(reconciler.jobs, reconciler.settings.worker.stale_upload_s)
            except Exception:
                log.warning("temp directory sweep failed", exc_info=True)
            try:
                report = reconciler.run_once()
                if report and (
                    report.requeued
                    or report.worker_lost
                    or report.expired
                    or report.ttl_expired
                    or report.unavailable
                ):
                    log.info("reconciler: %s", report)
            except Exception:
                log.warning("reconciler pass failed", exc_info=True)

    threading.Thread(target=loop, name="reconciler", daemon=True).start()
    return stop
