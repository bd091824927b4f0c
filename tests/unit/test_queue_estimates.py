"""The queue admission's arithmetic (``api/queue_admission.py``): waits from the model's
workers, running jobs and measured run time; the cache of figures; Retry-After; the
default ttl and the bound, on fakes of the store and of the presence leases. The real
stack's behaviour is tests/integration/test_queue_admission.py."""

from __future__ import annotations

from typing import Any

import pytest

from api.queue_admission import (
    QueueAdmission,
    QueueEstimates,
    QueueFigures,
    QueuePolicy,
    queue_policies,
)
from api.validation import resolve_ttl
from models.db import Job
from models.errors import InvalidRequest, QueueFull
from models.registry import parse_registry
from storage.settings import LimitSettings, QueueSettings
from tests.helpers import video_spec


def test_wait_without_workers_or_measure_is_unknown() -> None:
    assert QueueFigures(0, 0, (), 5.0).wait_s(0, 0) is None
    # an idle worker takes the next job now, even before anything was measured
    assert QueueFigures(0, 2, (100.0,), None).wait_s(0, 101) == 0.0
    assert QueueFigures(0, 2, (100.0,), None).wait_s(1, 101) is None


def test_wait_counts_each_worker_freeing_then_one_run_time_per_round() -> None:
    # two workers, S = 10 s: one started 4 s ago (6 s left), one 9 s ago (1 s left)
    figures = QueueFigures(0, 2, (96.0, 91.0), 10.0)
    assert [figures.wait_s(p, 100.0) for p in range(5)] == [1.0, 6.0, 11.0, 16.0, 21.0]
    # a job running past the mean frees "now", never in the past
    assert QueueFigures(0, 1, (50.0,), 10.0).wait_s(0, 100.0) == 0.0
    # running jobs beyond the leases count as workers (a lease renewal missed)
    assert QueueFigures(0, 0, (96.0,), 10.0).wait_s(1, 100.0) == 16.0


class FakeJobs:
    def __init__(self) -> None:
        self.reads = 0
        self.queued = 0
        self.starts: list[float] = []
        self.runs: list[float] = []
        self.fail = False

    def queue_figures(self, model: str, sample: int) -> tuple[int, list[float], list[float]]:
        self.reads += 1
        if self.fail:
            raise RuntimeError("database down")
        return self.queued, self.starts, self.runs[:sample]

    def count_queued(self, model: str) -> int:
        return self.queued


class FakePresence:
    def __init__(self, workers: int) -> None:
        self.workers = workers

    def count(self, model: str) -> int:
        return self.workers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _estimates(jobs: FakeJobs, workers: int = 1, **settings: Any) -> tuple[QueueEstimates, Clock]:
    clock = Clock()
    estimates = QueueEstimates(
        jobs,  # type: ignore[arg-type]
        FakePresence(workers),  # type: ignore[arg-type]
        QueueSettings(**settings),
        clock=clock,
    )
    return estimates, clock


def test_figures_are_cached_for_the_refresh_interval_and_a_failed_read_is_no_estimate() -> None:
    jobs = FakeJobs()
    jobs.starts, jobs.runs = [998.0], [4.0, 6.0]
    estimates, clock = _estimates(jobs, eta_refresh_s=2.0)
    assert estimates.estimated_start_at("m", 0) == 1003  # 5 s mean, 2 s run: 3 s left
    assert estimates.estimated_start_at("m", 1) == 1008
    assert jobs.reads == 1
    clock.now += 1.0
    estimates.estimated_start_at("m", 0)
    assert jobs.reads == 1  # within the refresh interval
    clock.now += 1.5
    jobs.fail = True
    # a failed re-read keeps the previous figures
    assert estimates.estimated_start_at("m", 0) is not None and jobs.reads == 2
    reads = jobs.reads
    estimates.estimated_start_at("m", 0)
    assert jobs.reads == reads  # a failed read is not retried before the next refresh
    down = FakeJobs()
    down.fail = True
    fresh, _ = _estimates(down)
    assert fresh.estimated_start_at("m", 0) is None
    assert fresh.estimated_start_at("m", 1) is None and down.reads == 1
    assert estimates.estimated_start_at("m", None) is None


def test_retry_after_is_the_wait_until_one_more_fits() -> None:
    jobs = FakeJobs()
    jobs.starts, jobs.runs = [999.0, 999.0], [10.0]
    estimates, _ = _estimates(jobs, workers=2, retry_after_s=42)
    # 5 queued, bound 4: two must start; both workers free in 9 s
    assert estimates.retry_after_s("m", 5, 4) == 9
    # 8 queued, bound 4: five must start: the 5th starts one round later
    assert estimates.retry_after_s("m", 8, 4) == 29
    nothing, _ = _estimates(FakeJobs(), workers=0, retry_after_s=42)
    assert nothing.retry_after_s("m", 5, 4) == 42
    idle = FakeJobs()
    idle.runs = [0.2]
    assert _estimates(idle, workers=1)[0].retry_after_s("m", 3, 3) == 1  # at least 1 s


def test_admission_gives_the_default_ttl_and_refuses_at_the_bound() -> None:
    jobs = FakeJobs()
    estimates, _ = _estimates(jobs, workers=0, retry_after_s=7)
    admission = QueueAdmission(
        jobs,  # type: ignore[arg-type]
        {"reference/video": QueuePolicy(max_depth=2, ttl_s=300)},
        estimates,
    )
    job = Job.new(video_spec(), id="video_a", owner="k")
    jobs.queued = 1
    admission.admit(job)
    assert job.ttl_s == 300 and job.spec["ttl_s"] == 300
    own = Job.new(video_spec(ttl_s=5), id="video_b", owner="k")
    admission.admit(own)
    assert own.ttl_s == 5  # the create's own ttl wins
    jobs.queued = 2
    with pytest.raises(QueueFull) as refused:
        admission.admit(Job.new(video_spec(), id="video_c", owner="k"))
    assert refused.value.code == "queue_full" and refused.value.param == "model"
    assert refused.value.status_code == 429 and refused.value.headers == {"Retry-After": "7"}
    other = Job.new(video_spec(model="m/unlisted"), id="video_d", owner="k")
    admission.admit(other)  # no policy: unbounded, no default ttl
    assert other.ttl_s is None


def test_policies_take_the_registry_entry_over_the_server_default() -> None:
    served = parse_registry(
        """
[[model]]
name = "a"
adapter = "reference.video"
max_queue_depth = 5
ttl_s = 0
[[model]]
name = "b"
adapter = "reference.video"
"""
    )
    policies = queue_policies(served, QueueSettings(max_depth=100, default_ttl_s=600))
    assert policies == {
        "a": QueuePolicy(max_depth=5, ttl_s=0),
        "b": QueuePolicy(max_depth=100, ttl_s=600),
    }


@pytest.mark.parametrize("value", [0, -1, 1.5, float("inf"), float("nan"), 10**9])
def test_a_ttl_out_of_range_names_ttl(value: float) -> None:
    with pytest.raises(InvalidRequest) as bad:
        resolve_ttl(value, LimitSettings())
    assert bad.value.param == "ttl"


def test_a_ttl_is_whole_seconds() -> None:
    assert resolve_ttl(None, LimitSettings()) is None
    assert resolve_ttl(30.0, LimitSettings()) == 30
    assert resolve_ttl(86400, LimitSettings(max_ttl_s=86400)) == 86400
