"""The reads of a model's queue (positions, counts, the figures of
``estimated_start_at``): the part of :class:`storage.jobs.JobStore` that admission and
status reads ask, built once like the rest of its statements
(:mod:`storage.job_statements`, :mod:`storage.fair_share`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Engine

from models.db import JobStatus, JobView
from storage import fair_share
from storage import job_statements as sql
from storage.db_raw import RawStatement


class QueueReads:
    """Mixed into :class:`storage.jobs.JobStore`, which sets what is declared here."""

    _fair: bool
    _engine: Engine
    _statement: Callable[[tuple[Any, ...], Callable[[], Any]], RawStatement]

    def queue_positions(self, jobs: Sequence[JobView]) -> dict[str, int]:
        """For queued jobs: how many queued jobs of the same model are ahead (0 = next);
        under fair share, how many round-robin across keys takes first
        (:mod:`storage.fair_share`).

        One statement for the whole page (a correlated count per job on the
        ``status, model, created_at`` index), not one round trip per queued job; built
        once (:data:`storage.job_statements.QUEUE_POSITIONS`): making its alias per call
        was 40% of a create. One job (a status read, a create) is counted on the raw
        path."""
        queued = [j.id for j in jobs if j.status == JobStatus.QUEUED]
        if not queued:
            return {}
        statements = fair_share if self._fair else sql
        if len(queued) == 1:
            one = self._statement(("position", self._fair), lambda: statements.QUEUE_POSITION)
            row = one.one({"job_id": queued[0]})
            return {} if row is None else {queued[0]: int(row[0] or 0)}
        with self._engine.connect() as conn:
            rows = conn.execute(statements.QUEUE_POSITIONS, {"ids": queued})
            return {job_id: int(n or 0) for job_id, n in rows}

    def count_active(self, owner: str) -> int:
        """The owner's jobs that are queued or in progress (one indexed COUNT)."""
        row = self._statement(("active",), lambda: sql.COUNT_ACTIVE).one({"owner": owner})
        return int(row[0]) if row is not None else 0

    def queue_stats(self) -> dict[str, tuple[int, float]]:
        """``model -> (queued jobs, created_at of the oldest)`` for models with queued
        jobs: one aggregate on the ``status, model, created_at`` index."""
        statement = self._statement(("queue_stats",), lambda: sql.QUEUE_STATS)
        return {model: (int(n), float(oldest)) for model, n, oldest in statement.all({})}

    def count_queued(self, model: str) -> int:
        """Queued jobs of ``model`` (its queue bound, ``OMNIQ_QUEUE__MAX_DEPTH``)."""
        row = self._statement(("queued",), lambda: sql.COUNT_QUEUED).one({"model": model})
        return int(row[0]) if row is not None else 0

    def queue_figures(self, model: str, sample: int) -> tuple[int, list[float], list[float]]:
        """``(queued jobs, start times of the running ones, run times of the last
        `sample` completed ones)`` of ``model``: what its ``estimated_start_at`` is
        computed from (``api/queue_admission.py``)."""
        params = {"model": model}
        starts = self._statement(("running_starts",), lambda: sql.RUNNING_STARTS).all(params)
        recent = self._statement(("run_times",), lambda: sql.RECENT_RUN_TIMES)
        runs = recent.all({**params, "limit": sample})
        return (
            self.count_queued(model),
            [float(r[0]) for r in starts if r[0] is not None],
            [float(r[0]) for r in runs if r[0] is not None],
        )
