"""One job run (workers/jobs/run.py) against a fake job row: its stop gates, its
heartbeat and its failure, without a database, a bus or a pipeline."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from models.db import Job
from models.errors import ErrorCode, JobLost, JobTimedOut
from storage.jobs import Lease
from storage.settings import Settings
from tests.helpers import video_spec
from workers.common.failpoints import Failpoints
from workers.jobs.run import STAGE_START, JobRun


class Row:
    """The job row as the run's writes see it (``JobStore``'s fenced methods)."""

    def __init__(self) -> None:
        self.ours = True
        self.writes: list[dict[str, Any]] = []
        self.failed: list[tuple[ErrorCode, str]] = []

    def still_owned(self, job_id: str, lease: Lease) -> bool:
        return self.ours

    def update_running(self, job_id: str, lease: Lease, **values: Any) -> bool:
        if self.ours:
            self.writes.append(values)
        return self.ours

    def fail(self, job_id: str, code: ErrorCode, message: str, **values: Any) -> bool:
        if self.ours:
            self.failed.append((code, message))
        return self.ours


def _run(row: Row, **worker: Any) -> tuple[JobRun, list[Any]]:
    settings = Settings(worker=worker)  # type: ignore[arg-type]
    job = Job.new(video_spec(timeout_s=60), id="video_run1", owner="test")
    job.attempt, job.progress, job.started_at = 1, 0, job.created_at
    events: list[Any] = []

    def publish(job: Job, event: Any, data: bytes | None) -> str | None:
        events.append(event)
        return None

    failpoints = Failpoints(None)
    run = JobRun(job, Lease("w", 1), row, settings, publish, failpoints)  # type: ignore[arg-type]
    return run, events


def test_a_stage_change_writes_progress_and_a_lost_row_stops_the_run() -> None:
    row = Row()
    run, events = _run(row)
    run.enter("denoise")
    assert row.writes[-1]["stage"] == "denoise"
    assert row.writes[-1]["progress"] == STAGE_START["denoise"]
    assert [e.type for e in events] == ["progress"]
    row.ours = False  # cancelled or taken over
    with pytest.raises(JobLost):
        run.enter("decode")


def test_the_block_gates_read_the_flag_and_the_deadline_not_the_row() -> None:
    row = Row()
    run, _ = _run(row)
    reason = run.in_step_stop()
    assert reason(1) is None
    row.ours = False  # unseen: the block gates read no row
    assert reason(2) is None
    run.stop.set()  # the bus watch or the heartbeat
    assert isinstance(reason(3), JobLost)
    run.stop = type(run.stop)()  # a fresh signal, and a run past its deadline
    run.deadline = time.time() - 1
    assert isinstance(reason(4), JobTimedOut)


def test_the_heartbeat_writes_step_progress_and_sets_the_stop_when_the_row_is_gone() -> None:
    row = Row()
    run, events = _run(row, progress_interval_s=0.01, heartbeat_s=0.05)
    run.enter("denoise")
    run.start(None, None)
    try:
        run.step = 1
        run.report(20)  # a step's progress: the writer thread writes it
        for _ in range(500):
            if any(w["step"] == 1 for w in row.writes):
                break
            threading.Event().wait(0.01)
        assert any(w["step"] == 1 and w["progress"] == 20 for w in row.writes)
        assert [e.step for e in events if e.type == "progress"][-1] == 1
        row.ours = False
        assert _wait(run.stop.is_set)  # its next heartbeat matched no row
    finally:
        run.close()


def test_a_failure_is_written_with_its_stable_code_and_the_stage() -> None:
    row = Row()
    run, events = _run(row)
    run.enter("denoise")
    assert run.failed(RuntimeError("boom")) == ErrorCode.INTERNAL_ERROR
    ((code, message),) = row.failed
    assert code == ErrorCode.INTERNAL_ERROR and message.endswith("in stage denoise")
    assert events[-1].type == "done" and events[-1].status == "failed"


def _wait(done: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if done():
            return True
        threading.Event().wait(0.01)
    return False
