"""Job repository: every state transition is one conditional UPDATE.

``WHERE status = expected`` (and, for a worker, its :class:`Lease`: ``worker_id = me AND
attempt = mine``) makes two workers unable to both own a job and turns a late result after
a cancel or a take-over into a no-op: whoever loses the race changes nothing and learns it
from the row count.

The statements of the request path and of a running job (status reads, claim, progress,
ownership checks, completion) are built once (:mod:`storage.job_statements`) and run on a
pooled DBAPI cursor (:class:`storage.db_raw.RawStatement`): a single statement in
autocommit is its own transaction, one round trip on PostgreSQL where a ``Session`` made
three (BEGIN, the statement, COMMIT or ROLLBACK), at a fraction of the CPU.

Every transition to an end (complete, fail, cancel) that took effect is followed by the
insert of the job's webhook deliveries (:meth:`storage.outbox.WebhookOutbox.enqueue`,
idempotent; the webhook sender's sweep repairs a process that died in between).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import ClauseElement, delete, select, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from models.db import Artifact, ErrorCode, Job, JobRecord, JobStatus
from storage import fair_share
from storage import job_statements as sql
from storage.db_raw import RawStatement
from storage.job_queue_reads import QueueReads
from storage.outbox import WebhookOutbox

log = logging.getLogger(__name__)

ACTIVE = (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value)

_COLUMNS = sql.COLUMNS
_ID = _COLUMNS.index("id")
_OWNER = _COLUMNS.index("owner")
_CREATED_AT = _COLUMNS.index("created_at")
_N = len(_COLUMNS)
_ARTIFACT_ID = _N + sql.ARTIFACT_COLUMNS.index("id")
# columns the ORM fills from a Python-side default when an object leaves them unset
_DEFAULTED = frozenset(c.key for c in sql.JOBS.columns if c.default is not None)

# (ascending, after a cursor) -> statement
_PAGES = {(a, b): sql.page(a, b) for a in (True, False) for b in (True, False)}


def _record(row: Sequence[Any]) -> JobRecord:
    return JobRecord(**dict(zip(_COLUMNS, row, strict=True)))


def _artifact(row: Sequence[Any]) -> Artifact:
    return Artifact(**dict(zip(sql.ARTIFACT_COLUMNS, row, strict=True)))


class Lease(NamedTuple):
    """What a run of a job holds: its worker and its attempt. The attempt is the fencing
    token (a take-over raises it), for the row here, for the job's events
    (:meth:`storage.bus.EventBus.publish`) and for its objects (``output/{attempt}/``)."""

    worker_id: str
    attempt: int


class JobStore(QueueReads):
    def __init__(self, sessions: sessionmaker[Session], *, fair_share: bool = False) -> None:
        """``fair_share``: queue positions as fair-share claims take jobs
        (:mod:`storage.fair_share`), not FIFO by model."""
        self._sessions = sessions
        self._fair = fair_share
        # Reads of the request path in autocommit on a server database: no BEGIN and no
        # ROLLBACK on return, one round trip per statement on PostgreSQL (each sees the
        # latest committed state). Not on SQLite: its driver begins no transaction for a
        # SELECT anyway, and SQLAlchemy would set and reset the level with PRAGMAs around
        # every checkout (half of a status read there).
        engine: Engine = sessions.kw["bind"]
        self._raw = engine
        self._sqlite = engine.dialect.name == "sqlite"
        # statements by what varies in them (the columns written, the artifact count)
        self._statements: dict[tuple[Any, ...], RawStatement] = {}
        self._by_id = self._statement(("by_id",), lambda: sql.JOB_BY_ID)
        if not self._sqlite:
            engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._engine = engine
        self.outbox = WebhookOutbox(sessions)

    def _ended(self, job_id: str, ended: bool) -> bool:
        """After a transition: when it ended the job, queue its webhook deliveries (a
        failure is logged, never raised: the job has ended either way, and the sender's
        sweep queues them later)."""
        if ended:
            try:
                self.outbox.enqueue(job_id)
            except Exception:
                log.warning("could not queue the webhooks of %s", job_id, exc_info=True)
        return ended

    def _statement(self, key: tuple[Any, ...], build: Callable[[], Any]) -> RawStatement:
        """The statement of ``key``, compiled on first use (a race compiles it twice)."""
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = RawStatement(self._raw, build())
        return found

    # ---- API side -------------------------------------------------------------------

    def create(self, job: Job, *, idempotency_window_s: float) -> tuple[Job, bool]:
        """Insert ``job``; with an idempotency key already used by the owner within the
        window, return that job instead. Returns ``(job, created)``. Without a key, one
        INSERT on the raw path (:meth:`_insert`)."""
        if not job.idempotency_key and self._insert(job):
            return job, True
        with self._sessions() as s:
            if job.idempotency_key:
                existing = self._by_idempotency_key(s, job.owner, job.idempotency_key)
                if existing is not None:
                    if existing.created_at >= time.time() - idempotency_window_s:
                        return existing, False
                    existing.idempotency_key = None  # expired: free the key
                    s.flush()
            s.add(job)
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
                if job.idempotency_key:
                    raced = self._by_idempotency_key(s, job.owner, job.idempotency_key)
                    if raced is not None:
                        return raced, False
                raise
            return job, True

    def _insert(self, job: Job) -> bool:
        """INSERT the columns ``job`` has values for, as the ORM's flush would (a column
        never set is left to the database: SQL NULL, where binding None would store a
        JSON ``null``); False, inserting nothing, when a column with a Python-side
        default is unset (:meth:`Job.new` sets them all), for the ORM to fill in."""
        values = sa_inspect(job).dict
        if not _DEFAULTED.issubset(values):
            return False
        names = tuple(c for c in _COLUMNS if c in values)
        statement = self._statement(("insert", names), lambda: sql.insert_job(names))
        statement.rowcount({n: values[n] for n in names})
        return True

    def find_idempotent(self, owner: str, key: str, window_s: float) -> Job | None:
        """The owner's job created with ``key`` within the window, if any."""
        with self._sessions() as s:
            job = self._by_idempotency_key(s, owner, key)
        if job is not None and job.created_at >= time.time() - window_s:
            return job
        return None

    @staticmethod
    def _by_idempotency_key(s: Session, owner: str, key: str) -> Job | None:
        return s.scalars(select(Job).where(Job.owner == owner, Job.idempotency_key == key)).first()

    def get(self, job_id: str, owner: str | None = None) -> Job | None:
        """The job as an ORM object outside any session (what a worker runs); its row is
        read as :meth:`read` reads it."""
        row = self._by_id.one({"job_id": job_id})
        if row is None or (owner is not None and row[_OWNER] != owner):
            return None
        return Job(**dict(zip(_COLUMNS, row, strict=True)))

    def read(self, job_id: str, owner: str | None = None) -> JobRecord | None:
        """The job's row, read-only (the API's status reads): one ``SELECT`` on a pooled
        DBAPI cursor, no ORM session, identity map or instance state, nor SQLAlchemy's
        execution context and result objects (on PostgreSQL they were most of a status
        read's database time). Attributes are named as on ``Job``; ``None`` for another
        owner's job."""
        row = self._by_id.one({"job_id": job_id})
        if row is None or (owner is not None and row[_OWNER] != owner):
            return None
        return _record(row)

    def page(
        self, owner: str, *, after: str | None, limit: int, order: str, kind: str
    ) -> tuple[list[JobRecord], bool]:
        """A page of the owner's jobs by ``created_at`` (ties by id), after a cursor id,
        as read-only rows (see :meth:`read`); one of four statements built once, run on
        the raw path."""
        params: dict[str, Any] = {"owner": owner, "kind": kind, "limit": limit + 1}
        if after is not None:
            cursor = self._by_id.one({"job_id": after})
            if cursor is None or cursor[_OWNER] != owner:
                raise KeyError(after)
            params |= {"cursor_created_at": cursor[_CREATED_AT], "cursor_id": cursor[_ID]}
        key = (order == "asc", after is not None)
        statement = self._statement(("page", *key), lambda: _PAGES[key])
        rows = [_record(row) for row in statement.all(params)]
        return rows[:limit], len(rows) > limit

    def expire_ttl(self, now: float, model: str | None = None) -> list[tuple[str, str, str]]:
        """Fail ``ttl_expired`` every queued job whose ``ttl`` passed by ``now`` (of
        ``model``, or of any); ``(id, kind, model)`` of each. One conditional UPDATE: a
        job a worker claimed meanwhile is not touched."""
        by_model = model is not None
        statement = self._statement(("expire_ttl", by_model), lambda: sql.expire_ttl(by_model))
        params = {
            "now": now,
            "model": model,
            "error_code": ErrorCode.TTL_EXPIRED.value,
            "error_message": "the job was still queued when its ttl passed",
        }
        rows = [(str(i), str(k), str(m)) for i, k, m in statement.all(params, write=True)]
        for job_id, _, _ in rows:
            self._ended(job_id, True)
        return rows

    def fail_queued(self, model: str, code: ErrorCode, message: str) -> list[tuple[str, str]]:
        """Fail every queued job of ``model`` with ``code``; ``(id, kind)`` of each. One
        conditional UPDATE: a job a worker claimed meanwhile is not touched."""
        statement = self._statement(("fail_queued",), lambda: sql.FAIL_QUEUED)
        params = {
            "model": model,
            "error_code": code.value,
            "error_message": message,
            "completed_at": time.time(),
        }
        rows = [(str(i), str(k)) for i, k, _ in statement.all(params, write=True)]
        for job_id, _ in rows:
            self._ended(job_id, True)
        return rows

    def cancel(self, job_id: str, message: str = "cancelled by the client") -> bool:
        """Fail a queued or running job with ``cancelled``; False if it had already ended."""
        statement = self._statement(("cancel",), lambda: sql.CANCEL)
        params = {
            "job_id": job_id,
            "error_code": ErrorCode.CANCELLED.value,
            "error_message": message,
            "completed_at": time.time(),
        }
        return self._ended(job_id, statement.rowcount(params) == 1)

    def delete(self, job_id: str) -> bool:
        with self._sessions() as s:
            s.execute(delete(Artifact).where(Artifact.job_id == job_id))
            res = s.execute(delete(Job).where(Job.id == job_id))
            s.commit()
            return int(res.rowcount) == 1  # type: ignore[attr-defined]

    def artifact(self, job_id: str, variant: str) -> Artifact | None:
        """The job's ``variant`` artifact row (an ORM object outside any session)."""
        statement = self._statement(("artifact",), lambda: sql.ARTIFACT)
        row = statement.one({"job_id": job_id, "variant": variant})
        return None if row is None else _artifact(row)

    def read_with_artifact(
        self, job_id: str, owner: str, variant: str
    ) -> tuple[JobRecord, Artifact | None] | None:
        """The job's row (as :meth:`read`) and its ``variant`` artifact, if it has one, in
        one statement: what serving content and answering a ``sync`` request need."""
        statement = self._statement(("with_artifact",), lambda: sql.JOB_WITH_ARTIFACT)
        row = statement.one({"job_id": job_id, "variant": variant})
        if row is None or row[_OWNER] != owner:
            return None
        artifact = None
        if row[_ARTIFACT_ID] is not None:
            artifact = _artifact(row[_N:])
        return _record(row[:_N]), artifact

    def insert_finished(self, job: Job, artifacts: list[Artifact]) -> None:
        """Store a job that finished elsewhere (a persisted realtime session) with its
        artifacts, in one transaction."""
        with self._sessions() as s:
            s.add(job)
            s.add_all(artifacts)
            s.commit()

    # ---- reconciler ---------------------------------------------------------------

    def stale_running(self, stale_before: float, limit: int = 100) -> list[Job]:
        """Running jobs whose worker has not heartbeated since ``stale_before``."""
        return self._jobs_where(
            Job.status == JobStatus.IN_PROGRESS.value, Job.heartbeat_at < stale_before, limit=limit
        )

    def queued_before(self, created_before: float, limit: int = 100) -> list[Job]:
        """Queued jobs created before ``created_before``."""
        return self._jobs_where(
            Job.status == JobStatus.QUEUED.value, Job.created_at < created_before, limit=limit
        )

    def expired_with_artifacts(self, now: float, limit: int = 100) -> list[Job]:
        """Completed jobs past ``expires_at`` that still have artifact rows."""
        has_artifacts = select(Artifact.id).where(Artifact.job_id == Job.id).exists()
        return self._jobs_where(
            Job.status == JobStatus.COMPLETED.value,
            Job.expires_at < now,
            has_artifacts,
            limit=limit,
        )

    def _jobs_where(self, *where: Any, limit: int) -> list[Job]:
        with self._sessions() as s:
            return list(s.scalars(select(Job).where(*where).limit(limit)))

    def drop_artifacts(self, job_id: str) -> None:
        with self._sessions() as s:
            s.execute(delete(Artifact).where(Artifact.job_id == job_id))
            s.commit()

    # ---- worker side ----------------------------------------------------------------

    def claim(self, job_id: str, worker_id: str) -> bool:
        """queued → in_progress for ``worker_id``; False if cancelled or already claimed."""
        statement = self._statement(("claim",), lambda: sql.CLAIM)
        params = {"job_id": job_id, "worker_id": worker_id, "now": time.time()}
        return statement.rowcount(params) == 1

    def claim_job(self, job_id: str, worker_id: str) -> Job | None:
        """:meth:`claim`, returning the claimed row (``UPDATE … RETURNING``): what a
        worker runs, without a read after the claim. None if it was not claimed."""
        statement = self._statement(("claim_job",), lambda: sql.CLAIM_RETURNING)
        params = {"job_id": job_id, "worker_id": worker_id, "now": time.time()}
        row = statement.one(params, write=True)
        return None if row is None else Job(**dict(zip(_COLUMNS, row, strict=True)))

    def claim_next(self, model: str, worker_id: str) -> Job | None:
        """Claim the fair next queued job of ``model`` (:mod:`storage.fair_share`) for
        ``worker_id``, returning its row; None when none is queued. Atomic: PostgreSQL
        skips rows another claim holds, SQLite runs one write at a time."""
        statement = self._statement(
            ("claim_next",), lambda: fair_share.claim_next(postgres=not self._sqlite)
        )
        params = {"model": model, "worker_id": worker_id, "now": time.time()}
        row = statement.one(params, write=True)
        return None if row is None else Job(**dict(zip(_COLUMNS, row, strict=True)))

    def take_over(
        self, job_id: str, worker_id: str, *, stale_before: float, max_attempts: int
    ) -> bool:
        """Take a running job whose owner stopped heartbeating (attempt + 1, bounded)."""
        statement = self._statement(("take_over",), lambda: sql.TAKE_OVER)
        params = {
            "job_id": job_id,
            "worker_id": worker_id,
            "stale_before": stale_before,
            "max_attempts": max_attempts,
            "now": time.time(),
        }
        return statement.rowcount(params) == 1

    def still_owned(self, job_id: str, lease: Lease) -> bool:
        """True while the job is running, not cancelled and held by ``lease``."""
        row = self._statement(("ownership",), lambda: sql.OWNERSHIP).one({"job_id": job_id})
        if row is None:
            return False
        status, owner, attempt, cancel_requested = row
        return (
            status == JobStatus.IN_PROGRESS
            and Lease(owner, attempt) == lease
            and not cancel_requested
        )

    def update_running(self, job_id: str, lease: Lease, **values: Any) -> bool:
        """Write progress/stage/heartbeat fields while ``lease`` holds the job; False once
        it doesn't.

        ``progress`` never decreases: the UPDATE only applies when the stored value is not
        larger than the new one."""
        names = tuple(sorted(values))
        statement = self._statement(("running", names), lambda: sql.update_running(names))
        params = {**_plain(values), "job_id": job_id, **lease._asdict()}
        return statement.rowcount({**params, "heartbeat_at": time.time()}) == 1

    def release(self, job_id: str, lease: Lease) -> bool:
        """in_progress → queued, while ``lease`` holds the job: its worker is shutting
        down and puts it back for the next one (:data:`storage.job_statements.RELEASE`).
        False: the job is not that run's any more (cancelled, taken over)."""
        statement = self._statement(("release",), lambda: sql.RELEASE)
        return statement.rowcount({"job_id": job_id, **lease._asdict()}) == 1

    def record_cancelled_run(
        self, job_id: str, lease: Lease, stage_durations: dict[str, float]
    ) -> bool:
        """The stage times of ``lease``'s run of a job cancelled under it
        (:func:`storage.job_statements.cancelled_run_durations`); False: not that run's."""
        statement = self._statement(("cancelled_run",), sql.cancelled_run_durations)
        params = {"stage_durations": stage_durations, "job_id": job_id, **lease._asdict()}
        return statement.rowcount(params) == 1

    def complete(self, job_id: str, lease: Lease, artifacts: list[Artifact], **values: Any) -> bool:
        """in_progress → completed and the artifact rows, in one transaction (on
        PostgreSQL one statement: :func:`storage.job_statements.complete`)."""
        now = time.time()
        if self._sqlite:  # no data-modifying CTE there
            with self._sessions() as s:
                res = s.execute(
                    update(Job)
                    .where(*_running(job_id, lease))
                    .values(status=JobStatus.COMPLETED.value, heartbeat_at=now, **values)
                )
                if int(res.rowcount) != 1:  # type: ignore[attr-defined]
                    s.rollback()
                    return False
                s.add_all(artifacts)
                s.commit()
            return self._ended(job_id, True)
        names = tuple(sorted(values))
        statement = self._statement(
            ("complete", names, len(artifacts)), lambda: sql.complete(names, len(artifacts))
        )
        params = {**_plain(values), "job_id": job_id, **lease._asdict(), "heartbeat_at": now}
        for i, artifact in enumerate(artifacts):
            params |= {f"{k}_{i}": getattr(artifact, k) for k in sql.ARTIFACT_VALUES[1:]}
        return self._ended(job_id, statement.rowcount(params) == max(len(artifacts), 1))

    def fail(
        self,
        job_id: str,
        code: ErrorCode,
        message: str,
        *,
        lease: Lease | None = None,
        **values: Any,
    ) -> bool:
        """Fail a job that is still active (and, given ``lease``, held by it)."""
        names = tuple(sorted(values))
        owned = lease is not None
        statement = self._statement(("fail", owned, names), lambda: sql.fail(owned, names))
        params = {
            **_plain(values),
            "job_id": job_id,
            **(lease._asdict() if lease is not None else {"worker_id": None, "attempt": None}),
            "error_code": code.value,
            "error_message": message,
            "completed_at": time.time(),
        }
        return self._ended(job_id, statement.rowcount(params) == 1)


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` to bind as they are: a SQL expression cannot go through a bind."""
    for name, value in values.items():
        if isinstance(value, ClauseElement):
            raise TypeError(f"{name}: a SQL expression, not a value")
    return values


def _running(job_id: str, lease: Lease) -> list[Any]:
    """The job is running, not cancelled and held by ``lease``."""
    return [
        Job.id == job_id,
        Job.status == JobStatus.IN_PROGRESS.value,
        Job.cancel_requested.is_(False),
        Job.worker_id == lease.worker_id,
        Job.attempt == lease.attempt,
    ]
