"""A run's objects in S3, fenced by its attempt.

Each attempt of a job uploads under its own prefix, ``{kind}s/{id}/output/{attempt}/``,
so a worker cut off mid-upload and presumed dead (a zombie: its job was taken over, attempt
+ 1) cannot overwrite the output of the attempt that took over, whatever it does once it
is back. What a run that did not complete may delete follows the same rule
(:func:`stale_prefix`); the attempt that completes deletes what earlier ones left
(:func:`drop_other_attempts`). The completed job's artifact rows name its own keys.
"""

from __future__ import annotations

import logging

from botocore.exceptions import BotoCoreError, ClientError
from sqlalchemy.exc import SQLAlchemyError

from models.common import JobStatus
from models.db import Job
from storage.artifacts import ArtifactStore, try_delete_prefix
from storage.constants import job_prefix
from storage.jobs import JobStore, Lease

log = logging.getLogger(__name__)


def output_prefix(job: Job, attempt: int) -> str:
    """Where attempt ``attempt`` of ``job`` puts its output."""
    return f"{job_prefix(job.kind, job.id)}output/{attempt}/"


def stale_prefix(jobs: JobStore, job: Job, lease: Lease) -> str:
    """What a run of ``job`` under ``lease`` that did not complete may delete: the whole
    job prefix (inputs too) once the job has ended without completing (failed, cancelled,
    deleted); otherwise only its own attempt's output: the job is still running (another
    attempt holds it, or will take it over and needs its inputs) or completed by another
    attempt. When the row cannot be read, the narrow answer."""
    try:
        row = jobs.get(job.id)
    except SQLAlchemyError:
        log.warning("could not read %s; deleting only attempt %d's output", job.id, lease.attempt)
        return output_prefix(job, lease.attempt)
    if row is None or row.status == JobStatus.FAILED:
        return job_prefix(job.kind, job.id)
    return output_prefix(job, lease.attempt)


def drop_other_attempts(artifacts: ArtifactStore, job: Job, attempt: int) -> int:
    """Delete the output of every attempt of ``job`` but ``attempt`` (the one that
    completed it); how many attempts' prefixes were deleted. A store that fails is
    logged, not raised (:func:`storage.artifacts.try_delete_prefix`): the job completed."""
    root = f"{job_prefix(job.kind, job.id)}output/"
    try:
        keys = artifacts.list_keys(root) + [u["Key"] for u in artifacts.iter_uploads(root)]
    except (ClientError, BotoCoreError) as exc:
        log.warning(
            "listing %s failed: %s; earlier attempts' output stays", root, type(exc).__name__
        )
        return 0
    others = {root + key[len(root) :].split("/", 1)[0] + "/" for key in keys}
    others.discard(output_prefix(job, attempt))
    return sum(try_delete_prefix(artifacts, prefix) for prefix in sorted(others))
