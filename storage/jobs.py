"""Job repository: every state transition is one conditional UPDATE.

``WHERE status = expected`` (and, for a worker, ``worker_id = me``) makes two workers
unable to both own a job and turns a late result after a cancel into a no-op: whoever
loses the race changes nothing and learns it from the row count.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, and_, bindparam, delete, func, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from models.db import Artifact, ErrorCode, Job, JobRecord, JobStatus, JobView
from storage.db_reads import RawSelect

ACTIVE = (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value)

_JOBS = Job.__table__
# Built once: SQLAlchemy caches the compiled form of a statement object it sees again.
_JOB_BY_ID = select(_JOBS).where(_JOBS.c.id == bindparam("job_id"))
_COLUMNS = tuple(_JOBS.columns.keys())  # the order ``select(_JOBS)`` returns them in
_OWNER = _COLUMNS.index("owner")


def _record(row: Any) -> JobRecord:
    return JobRecord(**dict(zip(_COLUMNS, row, strict=True)))


def _queue_positions_statement() -> Select[Any]:
    """``(id, queued jobs of the same model ahead of it)`` for the job ids ``:ids``."""
    ahead = _JOBS.alias("ahead")
    count = (
        select(func.count())
        .select_from(ahead)
        .where(
            ahead.c.status == JobStatus.QUEUED.value,
            ahead.c.model == _JOBS.c.model,
            or_(
                ahead.c.created_at < _JOBS.c.created_at,
                and_(ahead.c.created_at == _JOBS.c.created_at, ahead.c.id < _JOBS.c.id),
            ),
        )
        .scalar_subquery()
    )
    return select(_JOBS.c.id, count).where(_JOBS.c.id.in_(bindparam("ids", expanding=True)))


_QUEUE_POSITIONS = _queue_positions_statement()


def _page_statement(ascending: bool, after_cursor: bool) -> Select[Any]:
    """An owner's jobs of one kind by ``created_at`` then id, ``:limit`` of them, after the
    cursor job (``:cursor_created_at``, ``:cursor_id``) when ``after_cursor``."""
    c = _JOBS.c
    q = select(_JOBS).where(c.owner == bindparam("owner"), c.kind == bindparam("kind"))
    if after_cursor:
        at = bindparam("cursor_created_at", type_=c.created_at.type)
        cid = bindparam("cursor_id", type_=c.id.type)
        if ascending:
            q = q.where(or_(c.created_at > at, and_(c.created_at == at, c.id > cid)))
        else:
            q = q.where(or_(c.created_at < at, and_(c.created_at == at, c.id < cid)))
    if ascending:
        q = q.order_by(c.created_at.asc(), c.id.asc())
    else:
        q = q.order_by(c.created_at.desc(), c.id.desc())
    return q.limit(bindparam("limit"))


# (ascending, after a cursor) -> statement
_PAGES = {(a, b): _page_statement(a, b) for a in (True, False) for b in (True, False)}


class JobStore:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        # Reads of the request path in autocommit on a server database: no BEGIN and no
        # ROLLBACK on return, one round trip per statement on PostgreSQL (each sees the
        # latest committed state). Not on SQLite: its driver begins no transaction for a
        # SELECT anyway, and SQLAlchemy would set and reset the level with PRAGMAs around
        # every checkout (half of a status read there).
        engine: Engine = sessions.kw["bind"]
        self._by_id = RawSelect(engine, _JOB_BY_ID)
        if engine.dialect.name != "sqlite":
            engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._engine = engine

    # ---- API side -------------------------------------------------------------------

    def create(self, job: Job, *, idempotency_window_s: float) -> tuple[Job, bool]:
        """Insert ``job``; with an idempotency key already used by the owner within the
        window, return that job instead. Returns ``(job, created)``."""
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
        with self._sessions() as s:
            job = s.get(Job, job_id)
            if job is None or (owner is not None and job.owner != owner):
                return None
            return job

    def read(self, job_id: str, owner: str | None = None) -> JobRecord | None:
        """The job's row, read-only (the API's status reads): one ``SELECT`` on a pooled
        DBAPI cursor (:class:`storage.db_reads.RawSelect`), no ORM session, identity map
        or instance state, nor SQLAlchemy's execution context and result objects (on
        PostgreSQL they were most of a status read's database time). Attributes are named
        as on ``Job``; ``None`` for another owner's job."""
        row = self._by_id.one({"job_id": job_id})
        if row is None or (owner is not None and row[_OWNER] != owner):
            return None
        return _record(row)

    def page(
        self, owner: str, *, after: str | None, limit: int, order: str, kind: str
    ) -> tuple[list[JobRecord], bool]:
        """A page of the owner's jobs by ``created_at`` (ties by id), after a cursor id,
        as read-only rows (see :meth:`read`); one of four statements built once."""
        params: dict[str, Any] = {"owner": owner, "kind": kind, "limit": limit + 1}
        with self._engine.connect() as conn:
            if after is not None:
                cursor = conn.execute(_JOB_BY_ID, {"job_id": after}).one_or_none()
                if cursor is None or cursor.owner != owner:
                    raise KeyError(after)
                params |= {"cursor_created_at": cursor.created_at, "cursor_id": cursor.id}
            statement = _PAGES[(order == "asc", after is not None)]
            rows = [_record(row) for row in conn.execute(statement, params)]
        return rows[:limit], len(rows) > limit

    def queue_positions(self, jobs: Sequence[JobView]) -> dict[str, int]:
        """For queued jobs: how many queued jobs of the same model are ahead (0 = next).

        One statement for the whole page (a correlated count per job on the
        ``status, model, created_at`` index), not one round trip per queued job; built
        once (:data:`_QUEUE_POSITIONS`): making its alias per call was 40% of a create."""
        queued = [j.id for j in jobs if j.status == JobStatus.QUEUED]
        if not queued:
            return {}
        with self._engine.connect() as conn:
            rows = conn.execute(_QUEUE_POSITIONS, {"ids": queued})
            return {job_id: int(n or 0) for job_id, n in rows}

    def cancel(self, job_id: str, message: str = "cancelled by the client") -> bool:
        """Fail a queued or running job with ``cancelled``; False if it had already ended."""
        now = time.time()
        with self._sessions() as s:
            res = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(ACTIVE))
                .values(
                    status=JobStatus.FAILED.value,
                    error_code=ErrorCode.CANCELLED.value,
                    error_message=message,
                    cancel_requested=True,
                    completed_at=now,
                )
            )
            s.commit()
            return _rowcount(res) == 1

    def delete(self, job_id: str) -> bool:
        with self._sessions() as s:
            s.execute(delete(Artifact).where(Artifact.job_id == job_id))
            res = s.execute(delete(Job).where(Job.id == job_id))
            s.commit()
            return _rowcount(res) == 1

    def artifact(self, job_id: str, variant: str) -> Artifact | None:
        with self._sessions() as s:
            return s.scalars(
                select(Artifact).where(Artifact.job_id == job_id, Artifact.variant == variant)
            ).first()

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
        now = time.time()
        return self._update_one(
            (
                Job.id == job_id,
                Job.status == JobStatus.QUEUED.value,
                Job.cancel_requested.is_(False),
            ),
            status=JobStatus.IN_PROGRESS.value,
            worker_id=worker_id,
            attempt=Job.attempt + 1,
            started_at=func.coalesce(Job.started_at, now),
            heartbeat_at=now,
            stage="prepare",
        )

    def take_over(
        self, job_id: str, worker_id: str, *, stale_before: float, max_attempts: int
    ) -> bool:
        """Take a running job whose owner stopped heartbeating (attempt + 1, bounded)."""
        return self._update_one(
            (*_running(job_id), Job.heartbeat_at < stale_before, Job.attempt < max_attempts),
            worker_id=worker_id,
            attempt=Job.attempt + 1,
            heartbeat_at=time.time(),
            stage="prepare",
            step=0,
        )

    def still_owned(self, job_id: str, worker_id: str) -> bool:
        """True while the job is running, not cancelled and owned by ``worker_id``."""
        with self._sessions() as s:
            row = s.execute(
                select(Job.status, Job.worker_id, Job.cancel_requested).where(Job.id == job_id)
            ).first()
        return (
            row is not None
            and row.status == JobStatus.IN_PROGRESS
            and row.worker_id == worker_id
            and not row.cancel_requested
        )

    def update_running(self, job_id: str, worker_id: str, **values: Any) -> bool:
        """Write progress/stage/heartbeat fields while the job is ours; False once it isn't.

        ``progress`` never decreases: the UPDATE only applies when the stored value is not
        larger than the new one."""
        conditions = _running(job_id, worker_id)
        if "progress" in values:
            conditions.append(Job.progress <= values["progress"])
        return self._update_one(conditions, heartbeat_at=time.time(), **values)

    def _update_one(self, where: Sequence[Any], **values: Any) -> bool:
        """One conditional UPDATE of a job row; True when the row matched ``where``."""
        with self._sessions() as s:
            res = s.execute(update(Job).where(*where).values(**values))
            s.commit()
            return _rowcount(res) == 1

    def complete(
        self, job_id: str, worker_id: str, artifacts: list[Artifact], **values: Any
    ) -> bool:
        """in_progress → completed and the artifact rows, in one transaction."""
        with self._sessions() as s:
            res = s.execute(
                update(Job)
                .where(*_running(job_id, worker_id))
                .values(status=JobStatus.COMPLETED.value, heartbeat_at=time.time(), **values)
            )
            if _rowcount(res) != 1:
                s.rollback()
                return False
            s.add_all(artifacts)
            s.commit()
            return True

    def fail(
        self,
        job_id: str,
        code: ErrorCode,
        message: str,
        *,
        worker_id: str | None = None,
        **values: Any,
    ) -> bool:
        """Fail a job that is still active (and, given ``worker_id``, still ours)."""
        conditions = [Job.id == job_id, Job.status.in_(ACTIVE)]
        if worker_id is not None:
            conditions.append(Job.worker_id == worker_id)
        return self._update_one(
            conditions,
            status=JobStatus.FAILED.value,
            error_code=code.value,
            error_message=message,
            completed_at=time.time(),
            **values,
        )


def _running(job_id: str, worker_id: str | None = None) -> list[Any]:
    """The job is running and not cancelled (and owned by ``worker_id``, when given)."""
    conditions = [
        Job.id == job_id,
        Job.status == JobStatus.IN_PROGRESS.value,
        Job.cancel_requested.is_(False),
    ]
    if worker_id is not None:
        conditions.append(Job.worker_id == worker_id)
    return conditions


def _rowcount(result: Any) -> int:
    return int(result.rowcount)
