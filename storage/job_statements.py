"""The job repository's hot statements (:mod:`storage.jobs`), built once as Core
constructs with named bind parameters and run as :class:`storage.db_raw.RawStatement`.

Each transition's invariant is its ``WHERE``: see the methods of
:class:`storage.jobs.JobStore` that run them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Insert,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    func,
    insert,
    null,
    or_,
    select,
    union_all,
    update,
)

from models.db import Artifact, Job, JobStatus

JOBS = cast(Table, Job.__table__)
ARTIFACTS = cast(Table, Artifact.__table__)
COLUMNS = tuple(JOBS.columns.keys())  # the order ``select(JOBS)`` returns them in
ARTIFACT_COLUMNS = tuple(ARTIFACTS.columns.keys())
# What a worker writes of an artifact (its id is the table's sequence).
ARTIFACT_VALUES = tuple(k for k in ARTIFACT_COLUMNS if k != "id")

_QUEUED = JobStatus.QUEUED.value
_RUNNING = JobStatus.IN_PROGRESS.value


def param(name: str, column: str | None = None) -> BindParameter[Any]:
    """``:name``, typed as the job column ``column`` (default: the one named ``name``),
    so its value is converted as SQLAlchemy converts it (JSON, SQLite's floats)."""
    return bindparam(name, type_=JOBS.c[column or name].type)


def _active() -> ColumnElement[bool]:
    # not ``status IN (…)``: SQLAlchemy expands a literal IN list per execution
    return or_(JOBS.c.status == _QUEUED, JOBS.c.status == _RUNNING)


def _leased() -> list[ColumnElement[bool]]:
    """The run's lease: ``worker_id = :worker_id`` and ``attempt = :attempt``. The attempt
    is the fencing token: a take-over raises it, so a worker cut off and presumed dead
    (a zombie) writes nothing once it is back, even were its worker id reused."""
    return [JOBS.c.worker_id == bindparam("worker_id"), JOBS.c.attempt == bindparam("attempt")]


def running(owned: bool) -> list[ColumnElement[bool]]:
    """Job ``:job_id`` is running and not cancelled (and held by the run's lease)."""
    c = JOBS.c
    where = [c.id == bindparam("job_id"), c.status == _RUNNING, c.cancel_requested.is_(False)]
    if owned:
        where.extend(_leased())
    return where


JOB_BY_ID = select(JOBS).where(JOBS.c.id == bindparam("job_id"))

# The job row and its ``:variant`` artifact (NULLs without one): what serving content and
# a ``sync`` answer read, in one round trip.
JOB_WITH_ARTIFACT = (
    select(JOBS, *ARTIFACTS.c)
    .outerjoin(
        ARTIFACTS,
        and_(ARTIFACTS.c.job_id == JOBS.c.id, ARTIFACTS.c.variant == bindparam("variant")),
    )
    .where(JOBS.c.id == bindparam("job_id"))
)

ARTIFACT = select(ARTIFACTS).where(
    ARTIFACTS.c.job_id == bindparam("job_id"), ARTIFACTS.c.variant == bindparam("variant")
)

OWNERSHIP = select(JOBS.c.status, JOBS.c.worker_id, JOBS.c.attempt, JOBS.c.cancel_requested).where(
    JOBS.c.id == bindparam("job_id")
)


def _ahead() -> Any:
    """How many queued jobs of the same model are ahead of the outer ``jobs`` row."""
    ahead = JOBS.alias("ahead")
    return (
        select(func.count())
        .select_from(ahead)
        .where(
            ahead.c.status == _QUEUED,
            ahead.c.model == JOBS.c.model,
            or_(
                ahead.c.created_at < JOBS.c.created_at,
                and_(ahead.c.created_at == JOBS.c.created_at, ahead.c.id < JOBS.c.id),
            ),
        )
        .scalar_subquery()
    )


# ``(id, queued jobs of the same model ahead of it)`` for the job ids ``:ids``.
QUEUE_POSITIONS = select(JOBS.c.id, _ahead()).where(JOBS.c.id.in_(bindparam("ids", expanding=True)))
# The same for one job ``:job_id`` (a status read, a create).
QUEUE_POSITION = select(_ahead()).select_from(JOBS).where(JOBS.c.id == bindparam("job_id"))
# ``(model, queued jobs, oldest created_at)`` per model with queued jobs: a range of the
# ``status, model, created_at`` index (the metrics' queue depth, ``api/metrics.py``).
QUEUE_STATS = (
    select(JOBS.c.model, func.count(), func.min(JOBS.c.created_at))
    .where(JOBS.c.status == _QUEUED)
    .group_by(JOBS.c.model)
)


# What a model's ``estimated_start_at`` is computed from (``api/queue_admission.py``):
# its queued jobs (a count on the ``status, model, created_at`` index), the start times
# of its running jobs, and the run times of its ``:limit`` most recently created
# completed jobs.
COUNT_QUEUED = select(func.count()).where(
    JOBS.c.status == _QUEUED, JOBS.c.model == bindparam("model")
)
RUNNING_STARTS = select(JOBS.c.started_at).where(
    JOBS.c.status == _RUNNING, JOBS.c.model == bindparam("model")
)
RECENT_RUN_TIMES = (
    select(JOBS.c.completed_at - JOBS.c.started_at)
    .where(
        JOBS.c.status == JobStatus.COMPLETED.value,
        JOBS.c.model == bindparam("model"),
        JOBS.c.started_at.is_not(None),
    )
    .order_by(JOBS.c.created_at.desc())
    .limit(bindparam("limit"))
)


# A key's jobs that are queued or running (its ``max_active_jobs`` quota): a count on the
# ``(owner, status)`` index.
COUNT_ACTIVE = (
    select(func.count()).select_from(JOBS).where(JOBS.c.owner == bindparam("owner"), _active())
)


def page(ascending: bool, after_cursor: bool) -> Select[Any]:
    """An owner's jobs of one kind by ``created_at`` then id, ``:limit`` of them, after the
    cursor job (``:cursor_created_at``, ``:cursor_id``) when ``after_cursor``."""
    c = JOBS.c
    q = select(JOBS).where(c.owner == bindparam("owner"), c.kind == bindparam("kind"))
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


def insert_job(names: Iterable[str]) -> Insert:
    """A new job row with the columns ``names`` (``:name`` each)."""
    return insert(JOBS).values({n: param(n) for n in names})


def claim_values() -> dict[str, Any]:
    """What a claim writes: running for ``:worker_id`` since ``:now`` (a job's first
    start is kept), one attempt more."""
    c = JOBS.c
    return {
        "status": _RUNNING,
        "worker_id": bindparam("worker_id"),
        "attempt": c.attempt + 1,
        "started_at": func.coalesce(c.started_at, param("now", "heartbeat_at")),
        "heartbeat_at": param("now", "heartbeat_at"),
        "stage": "prepare",
    }


def within_ttl(table: Any = JOBS) -> ColumnElement[bool]:
    """The job has no ``ttl`` or its ttl has not passed by ``:now``: a job still queued
    past its ttl is never claimed (the sweep ends it, :data:`EXPIRE_TTL`)."""
    c = table.c
    return or_(c.ttl_s.is_(None), c.created_at + c.ttl_s > param("now", "heartbeat_at"))


def _claim() -> Update:
    c = JOBS.c
    return (
        update(JOBS)
        .where(c.id == bindparam("job_id"), c.status == _QUEUED, c.cancel_requested.is_(False))
        .where(within_ttl())
        .values(claim_values())
    )


def expire_ttl(by_model: bool) -> Update:
    """queued → failed ``:error_code`` for every queued job whose ``ttl`` passed by
    ``:now`` (of ``:model`` when ``by_model``), returning ``(id, kind, model)`` of each."""
    c = JOBS.c
    where = [c.status == _QUEUED, c.ttl_s.is_not(None)]
    where.append(c.created_at + c.ttl_s <= param("now", "completed_at"))
    if by_model:
        where.append(c.model == bindparam("model"))
    return (
        update(JOBS)
        .where(*where)
        .values(
            status=JobStatus.FAILED.value,
            error_code=param("error_code"),
            error_message=param("error_message"),
            completed_at=param("now", "completed_at"),
        )
        .returning(c.id, c.kind, c.model)
    )


# queued → failed ``:error_code`` for every queued job of ``:model`` (its model cannot be
# loaded by any live worker), returning ``(id, kind, model)`` of each.
FAIL_QUEUED = (
    update(JOBS)
    .where(JOBS.c.status == _QUEUED, JOBS.c.model == bindparam("model"))
    .values(
        status=JobStatus.FAILED.value,
        error_code=param("error_code"),
        error_message=param("error_message"),
        completed_at=param("completed_at"),
    )
    .returning(JOBS.c.id, JOBS.c.kind, JOBS.c.model)
)

CLAIM = _claim()
# Built on its own, not as ``CLAIM.returning(…)``: the copy would keep CLAIM's memoized
# (empty) ``exported_columns`` once CLAIM has been compiled for a raw statement.
CLAIM_RETURNING = _claim().returning(*JOBS.c)

TAKE_OVER = (
    update(JOBS)
    .where(*running(owned=False))
    .where(JOBS.c.heartbeat_at < param("stale_before", "heartbeat_at"))
    .where(JOBS.c.attempt < bindparam("max_attempts"))
    .values(
        worker_id=bindparam("worker_id"),
        attempt=JOBS.c.attempt + 1,
        heartbeat_at=param("now", "heartbeat_at"),
        stage="prepare",
        step=0,
    )
)

# running → queued for the next worker (its own is shutting down): only while the
# run's lease holds it. ``attempt`` stays, the fencing token the next claim raises.
RELEASE = (
    update(JOBS)
    .where(*running(owned=True))
    .values(status=_QUEUED, worker_id=null(), heartbeat_at=null(), stage="queue", step=0)
)

CANCEL = (
    update(JOBS)
    .where(JOBS.c.id == bindparam("job_id"), _active())
    .values(
        status=JobStatus.FAILED.value,
        error_code=param("error_code"),
        error_message=param("error_message"),
        cancel_requested=True,
        completed_at=param("completed_at"),
    )
)


def update_running(values: Iterable[str]) -> Update:
    """Write ``values`` (and ``heartbeat_at``) while the job is running and ours; with
    ``progress`` among them, only when the stored progress is not larger."""
    names = sorted({*values, "heartbeat_at"})
    where = running(owned=True)
    if "progress" in names:
        where.append(JOBS.c.progress <= param("progress"))
    return update(JOBS).where(*where).values({n: param(n) for n in names})


def cancelled_run_durations() -> Update:
    """The ``stage_durations`` of a run whose job was cancelled under it: the cancel ended
    the row, so the run's time in its last stage was never written (a job cancelled after
    9 steps showed a denoise of 0). Only the cancelled job's row and only while it still
    names this run's lease: a take-over's attempt fences a run presumed dead."""
    return (
        update(JOBS)
        .where(
            JOBS.c.id == bindparam("job_id"),
            JOBS.c.cancel_requested.is_(True),
            *_leased(),
        )
        .values(stage_durations=param("stage_durations"))
    )


def fail(owned: bool, values: Iterable[str]) -> Update:
    """Fail job ``:job_id`` while it is active (and held by the run's lease)."""
    where = [JOBS.c.id == bindparam("job_id"), _active()]
    if owned:
        where.extend(_leased())
    names = sorted({*values, "error_code", "error_message", "completed_at"})
    sets = {n: param(n) for n in names}
    return update(JOBS).where(*where).values(status=JobStatus.FAILED.value, **sets)


def complete(values: Iterable[str], artifacts: int) -> Update | Insert:
    """in_progress → completed with ``values``, and ``artifacts`` artifact rows
    (``:variant_0``, ``:key_0`` …), as one statement: the INSERT selects from the
    UPDATE's ``RETURNING`` (a data-modifying CTE, PostgreSQL), so it inserts the rows
    when the job was still ours and nothing otherwise, atomically and in one round trip;
    its row count says which."""
    names = sorted({*values, "heartbeat_at"})
    done = (
        update(JOBS)
        .where(*running(owned=True))
        .values(status=JobStatus.COMPLETED.value, **{n: param(n) for n in names})
    )
    if not artifacts:
        return done
    cte = done.returning(JOBS.c.id).cte("done")
    rows = [
        select(cte.c.id, *[_artifact_param(k, i) for k in ARTIFACT_VALUES[1:]])
        for i in range(artifacts)
    ]
    assert ARTIFACT_VALUES[0] == "job_id"
    source = rows[0] if artifacts == 1 else union_all(*rows)
    return insert(ARTIFACTS).from_select(list(ARTIFACT_VALUES), source).add_cte(cte)


def _artifact_param(column: str, i: int) -> BindParameter[Any]:
    return bindparam(f"{column}_{i}", type_=ARTIFACTS.c[column].type)
