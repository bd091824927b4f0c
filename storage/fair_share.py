"""Fair share across API keys: which queued job of a model a worker claims next, and the
queue positions that choice implies (``docs/limits.md``).

Claim-time fair selection. Every job still has exactly one Celery message on its model's
queue, but a worker that takes a message claims the *fair next* queued job of that model
rather than the message's own job (:data:`storage.jobs.JobStore.claim_next`); messages
and jobs stay one-to-one in number, so every job runs once, Celery's delivery guarantees
(late acks, redelivery) are unchanged, and a message whose job was cancelled runs
someone else's. The fair next job is, among keys with a queued job of the model:

1. the key with the fewest jobs of the model in progress (a key holding every worker
   yields the next free one);
2. then the key whose last start on the model is oldest (a key never served first): with
   equal running counts keys take turns, round-robin;
3. FIFO within the key (``created_at``, then id).

One statement: an UPDATE of the row a sub-select picks, ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL (two workers claiming at once take the best and the second best, neither
waits), a conditional UPDATE on SQLite (which runs one write at a time). Its cost grows
with the queued jobs of the model (their index range is read once) and the keys among
them (two index lookups each), not with the table.

Queue positions under fair share count what round-robin takes first: a job that is the
key's ``k``-th queued one (0-based) has ahead of it the key's own ``k`` and, of every
other key, as many as that key has with a turn before ``k``, i.e. ``min(queued, k)``.
The turn order inside one round (at most one job of each other key) is not counted, so
the position is a lower bound off by at most the number of other waiting keys.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Update, and_, bindparam, func, select, update

from storage.job_statements import COLUMNS, JOBS, claim_values, within_ttl

_QUEUED = "queued"
_RUNNING = "in_progress"


def _queued_of(table: Any, model: Any) -> ColumnElement[bool]:
    c = table.c
    return and_(c.status == _QUEUED, c.model == model, c.cancel_requested.is_(False))


def claim_next(postgres: bool) -> Update:
    """queued → in_progress for ``:worker_id`` of the fair next queued job of ``:model``
    (see the module docstring), returning its row; no row when none is queued."""
    model = bindparam("model", type_=JOBS.c.model.type)
    waiting = JOBS.alias("waiting")
    owners = select(waiting.c.owner).where(_queued_of(waiting, model)).distinct().subquery()
    run = JOBS.alias("run")
    running = (
        select(func.count())
        .select_from(run)
        .where(run.c.owner == owners.c.owner, run.c.status == _RUNNING, run.c.model == model)
        .scalar_subquery()
    )
    served = JOBS.alias("served")
    last_start = (  # IS NOT NULL: the index range starts at the owner's last start
        select(func.max(served.c.started_at))
        .where(
            served.c.owner == owners.c.owner,
            served.c.model == model,
            served.c.started_at.is_not(None),
        )
        .scalar_subquery()
    )
    # Materialized: ranked once per claim, not once per queued row (a planner that
    # inlines it evaluates both subqueries for every queued job: quadratic).
    keys = (
        select(owners.c.owner, running.label("running"), last_start.label("last_start"))
        .cte("fair_keys")
        .prefix_with("MATERIALIZED")
    )
    q = JOBS.alias("q")
    pick = (
        select(q.c.id)
        .join(keys, keys.c.owner == q.c.owner)
        .where(_queued_of(q, model), within_ttl(q))
        .order_by(keys.c.running, keys.c.last_start.asc().nulls_first(), q.c.created_at, q.c.id)
        .limit(1)
    )
    if postgres:
        pick = pick.with_for_update(of=q, skip_locked=True)
    c = JOBS.c
    return (
        update(JOBS)
        .where(c.id == pick.scalar_subquery(), c.status == _QUEUED, c.cancel_requested.is_(False))
        .where(within_ttl())
        .values(claim_values())
        .returning(*[JOBS.c[name] for name in COLUMNS])
    )


def _turns(where: ColumnElement[bool]) -> Any:
    """Queued jobs matching ``where`` with their turn within their key and model (0 for
    each key's oldest)."""
    c = JOBS.c
    turn = func.row_number().over(partition_by=(c.model, c.owner), order_by=(c.created_at, c.id))
    return select(c.id, c.model, (turn - 1).label("turn")).where(c.status == _QUEUED, where)


def _position_one() -> Any:
    c = JOBS.c
    of_model = select(c.model).where(c.id == bindparam("job_id")).scalar_subquery()
    turns = _turns(c.model == of_model).cte("turns")
    mine = select(turns.c.turn).where(turns.c.id == bindparam("job_id")).scalar_subquery()
    return select(func.count()).select_from(turns).where(turns.c.turn < mine)


def _positions_many() -> Any:
    c = JOBS.c
    ids: BindParameter[Any] = bindparam("ids", expanding=True)
    models = select(c.model).where(c.id.in_(ids))
    turns = _turns(c.model.in_(models)).cte("turns")
    ahead = turns.alias("ahead")
    count = (
        select(func.count())
        .select_from(ahead)
        .where(ahead.c.model == turns.c.model, ahead.c.turn < turns.c.turn)
        .scalar_subquery()
    )
    return select(turns.c.id, count).where(turns.c.id.in_(ids))


# Under fair share: the round-robin position of one queued job ``:job_id``, and
# ``(id, position)`` of the queued jobs among ``:ids`` (a list page).
QUEUE_POSITION = _position_one()
QUEUE_POSITIONS = _positions_many()
