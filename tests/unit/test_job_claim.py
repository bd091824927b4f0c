"""The rule "job A's message may run job B" (workers/jobs/claim.py)."""

from __future__ import annotations

from models.db import Job
from workers.jobs.claim import may_run


def _job(job_id: str, model: str) -> Job:
    return Job(id=job_id, model=model)


def test_a_message_may_always_run_its_own_job() -> None:
    for fair_share in (False, True):
        assert may_run("video_a", "m/x", _job("video_a", "m/x"), fair_share=fair_share)


def test_under_fair_share_a_message_may_run_another_job_of_its_model_only() -> None:
    assert may_run("video_a", "m/x", _job("video_b", "m/x"), fair_share=True)
    assert not may_run("video_a", "m/x", _job("video_b", "m/y"), fair_share=True)


def test_without_fair_share_a_message_runs_its_own_job_only() -> None:
    assert not may_run("video_a", "m/x", _job("video_b", "m/x"), fair_share=False)
