"""The webhook outbox: one ``webhook_deliveries`` row per ended job and destination URL,
claimed and marked by the senders (``workers/services/webhooks.py``), every attempt kept in
``webhook_attempts``.

* **Enqueue** (:meth:`WebhookOutbox.enqueue`) runs right after a job's terminal UPDATE
  (:class:`storage.jobs.JobStore`: a worker's complete or fail, the API's cancel, the
  reconciler's ``worker_lost``), never in place of it: it reads the ended row and its
  owner's endpoints and inserts the rows of the destinations that want the event. Its
  ``event_id`` is derived from the job id and ``(event_id, url)`` is unique, so enqueueing
  twice (a retry, the sweep, two racing processes) inserts nothing the second time.
* **Sweep** (:meth:`WebhookOutbox.sweep`): a process can die between the job's UPDATE and the
  insert; the sender re-enqueues jobs that ended within a window and have no delivery.
* **Claim** (:meth:`WebhookOutbox.claim`) is a conditional UPDATE of due rows (PostgreSQL locks
  them first ``FOR UPDATE SKIP LOCKED``, SQLite serializes writers) that moves their
  ``next_attempt_at`` past a lease and stamps a claim token, so two senders never send the
  same attempt and a sender that dies mid-attempt loses its claim when the lease ends.
* **Record** (:meth:`WebhookOutbox.record`) stores the attempt and the delivery's next state in
  one transaction, only while the claim is still the sender's.

State lives in the database alone: a restarted sender picks up where the last one was.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from sqlalchemy import Engine, Table, exists, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from models.db import Job, JobStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.webhooks import WebhookEvent, WebhookEventData, event_type

JOBS = cast(Table, Job.__table__)
DELIVERIES = cast(Table, WebhookDelivery.__table__)
ATTEMPTS = cast(Table, WebhookAttempt.__table__)
ENDPOINTS = cast(Table, WebhookEndpoint.__table__)

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
Outcome = Literal["delivered", "retry", "failed"]
_ENDED = (JobStatus.COMPLETED.value, JobStatus.FAILED.value)
_SWEEP_BATCH = 500

# The ended job with each of its owner's endpoints (a row of NULLs without one).
_ENDED_JOB = (
    select(
        JOBS.c.kind,
        JOBS.c.status,
        JOBS.c.error_code,
        JOBS.c.owner,
        JOBS.c.spec,
        JOBS.c.completed_at,
        ENDPOINTS.c.url,
        ENDPOINTS.c.events,
    )
    .select_from(JOBS.outerjoin(ENDPOINTS, ENDPOINTS.c.owner == JOBS.c.owner))
    .order_by(ENDPOINTS.c.created_at)
)


def event_id(job_id: str) -> str:
    """The ``webhook-id`` of a job's terminal event: the same wherever it is computed."""
    return "evt_" + hashlib.sha256(job_id.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Claimed:
    """A delivery a sender has claimed for one attempt."""

    id: int
    event_id: str
    event_type: str
    job_id: str
    owner: str
    url: str
    payload: str
    attempts: int  # made before this one
    created_at: float


@dataclass(frozen=True)
class Attempt:
    """How one attempt went, and what happens next (``next_attempt_at`` for a retry)."""

    outcome: Outcome
    started_at: float
    duration_s: float
    # the receiver's status code, or None and why there was none (timeout, refused …)
    answer: tuple[int | None, str | None]
    next_attempt_at: float | None = None


_CLAIMED_COLUMNS = tuple(Claimed.__dataclass_fields__)


class WebhookOutbox:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        engine: Engine = sessions.kw["bind"]
        self._engine = engine
        self._dialect = sqlite if engine.dialect.name == "sqlite" else postgresql

    # ---- enqueue --------------------------------------------------------------------

    def enqueue(self, job_id: str, now: float | None = None) -> int:
        """Insert the deliveries of ``job_id``'s terminal event (none while it runs or
        when no destination wants it); the number of new rows."""
        now = time.time() if now is None else now
        with self._engine.begin() as conn:
            rows = conn.execute(_ENDED_JOB.where(JOBS.c.id == job_id)).all()
            if not rows or rows[0].status not in _ENDED:
                return 0
            endpoints = [(r.url, r.events) for r in rows if r.url is not None]
            values = _deliveries(job_id, rows[0], endpoints, now)
            if not values:
                return 0
            statement = self._dialect.insert(DELIVERIES).values(values)
            statement = statement.on_conflict_do_nothing(index_elements=["event_id", "url"])
            # counted by RETURNING: psycopg's rowcount of this statement was not the rows
            return len(conn.execute(statement.returning(DELIVERIES.c.id)).all())

    def sweep(self, since: float, now: float | None = None) -> int:
        """Enqueue the events of jobs that ended since ``since`` with a destination but no
        delivery row; the number of rows inserted."""
        j, d = JOBS.c, DELIVERIES.c
        has_destination = or_(
            j.spec["webhook"].as_string().is_not(None),
            j.owner.in_(select(ENDPOINTS.c.owner)),
        )
        q = (
            select(j.id)
            .where(j.completed_at >= since, or_(*(j.status == s for s in _ENDED)))
            .where(has_destination, ~exists().where(d.job_id == j.id))
            .limit(_SWEEP_BATCH)
        )
        with self._engine.connect() as conn:
            ids = list(conn.scalars(q))
        return sum(self.enqueue(job_id, now) for job_id in ids)

    # ---- send -----------------------------------------------------------------------

    def claim(self, token: str, limit: int, lease_s: float, now: float) -> list[Claimed]:
        """Up to ``limit`` due pending deliveries, claimed for ``lease_s`` under ``token``.

        PostgreSQL: the due ids are locked first (``FOR UPDATE SKIP LOCKED``: rows another
        sender is claiming are passed over, not waited for), then updated, in one
        transaction. Not as ``UPDATE … WHERE id IN (that SELECT)``: the planner may run
        the sub-select again per row, and each run skips the rows the update has already
        locked, so it claimed past ``limit``. SQLite: one conditional UPDATE (writers take
        the database's one write lock, so the sub-select cannot race another sender)."""
        d = DELIVERIES.c
        due = (
            select(d.id)
            .where(d.status == PENDING, d.next_attempt_at <= now)
            .order_by(d.next_attempt_at)
            .limit(limit)
        )
        with self._engine.begin() as conn:
            if self._dialect is postgresql:
                ids: Any = list(conn.scalars(due.with_for_update(skip_locked=True)))
                if not ids:
                    return []
            else:
                ids = due
            statement = (
                update(DELIVERIES)
                .where(d.id.in_(ids), d.status == PENDING, d.next_attempt_at <= now)
                .values(next_attempt_at=now + lease_s, claim_token=token)
                .returning(*(d[name] for name in _CLAIMED_COLUMNS))
            )
            rows = conn.execute(statement).all()
        return sorted((Claimed(*row) for row in rows), key=lambda c: c.id)

    def record(self, delivery: Claimed, token: str, attempt: Attempt) -> bool:
        """Store ``attempt`` and the delivery's next state; False (the attempt is kept,
        the state is not changed) when the claim had passed to another sender."""
        d = DELIVERIES.c
        status_code, error = attempt.answer
        values: dict[str, Any] = {
            "attempts": d.attempts + 1,
            "last_status_code": status_code,
            "last_error": error,
            "claim_token": None,
        }
        if attempt.outcome == "retry":
            values["next_attempt_at"] = attempt.next_attempt_at
        else:
            values["status"] = DELIVERED if attempt.outcome == "delivered" else FAILED
            values["finished_at"] = attempt.started_at + attempt.duration_s
        with self._engine.begin() as conn:
            conn.execute(
                insert(ATTEMPTS).values(
                    delivery_id=delivery.id,
                    attempt=delivery.attempts + 1,
                    started_at=attempt.started_at,
                    duration_s=attempt.duration_s,
                    status_code=status_code,
                    error=error,
                    outcome=attempt.outcome,
                )
            )
            res = conn.execute(
                update(DELIVERIES)
                .where(d.id == delivery.id, d.claim_token == token)
                .values(**values)
            )
        return int(res.rowcount) == 1

    # ---- reads (CLI, tests) ---------------------------------------------------------

    def deliveries(self, job_id: str) -> list[dict[str, Any]]:
        """The deliveries of a job's event, each with its ``attempts`` (oldest first)."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(DELIVERIES).where(DELIVERIES.c.job_id == job_id).order_by(DELIVERIES.c.id)
            ).mappings()
            out = [dict(row) for row in rows]
            for delivery in out:
                attempts = conn.execute(
                    select(ATTEMPTS)
                    .where(ATTEMPTS.c.delivery_id == delivery["id"])
                    .order_by(ATTEMPTS.c.attempt)
                ).mappings()
                delivery["attempts_made"] = [dict(a) for a in attempts]
        return out


def _deliveries(
    job_id: str, job: Any, endpoints: Sequence[tuple[str, list[str] | None]], now: float
) -> list[dict[str, Any]]:
    """The rows of the job's event: one per destination URL that wants it (the job's own
    ``webhook`` first, then its owner's endpoints; a URL named twice gets it once)."""
    kind = event_type(job.kind, job.status, job.error_code)
    hook = (job.spec or {}).get("webhook")
    destinations = list(endpoints)
    if hook:
        destinations.insert(0, (hook["url"], hook.get("events")))
    urls = [url for url, events in destinations if events is None or kind in events]
    if not urls:
        return []
    eid = event_id(job_id)
    created = int(job.completed_at if job.completed_at is not None else now)
    payload = WebhookEvent(
        id=eid, type=kind, created_at=created, data=WebhookEventData(id=job_id)
    ).model_dump_json()
    return [
        {
            "event_id": eid,
            "event_type": kind,
            "job_id": job_id,
            "owner": job.owner,
            "url": url,
            "payload": payload,
            "status": PENDING,
            "attempts": 0,
            "next_attempt_at": now,
            "created_at": now,
        }
        for url in dict.fromkeys(urls)
    ]
