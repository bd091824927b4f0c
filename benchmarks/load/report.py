"""What a load level's jobs did, from the clients' records alone (``benchmarks/load/run.py``
adds what its watchers saw: probes, RSS, queue depth, leftovers). Pure: no I/O.

The report's keys (the whole run's, then each level's):

**Report** (stdout; ``--out`` also writes it): ``command``, ``date``, ``git``,
``machine``, ``stack``, ``workload``, ``server_features`` (``ttl`` accepted,
``estimated_start_at`` present), ``percentile_rule``, ``saturation`` (``rps``,
``measured``, ``clients``, ``completed``, ``window_s``, ``e2e_s``, ``queue_depth_min``,
``queue_depth_mean``), ``levels`` (one
object each, below), ``generator_cpu_s``, ``interrupted``, ``up_exit_code``,
``total_wall_s``. Per level:

- ``level``, ``duration_s``, ``offered_rps_target``, ``offered_rps`` (arrivals /
  duration), ``arrivals``, ``achieved_rps`` (jobs completed within the level's window /
  duration), ``completed_rps_with_settle`` (every completed job of the level / the time
  until the last one ended);
- ``creates_by_http_status`` (first create of each arrival; ``none`` = no answer, a
  hung-up /sync), ``refusals_by_code`` (``error.code`` of non-200 creates),
  ``queue_full_refusals``, ``queue_full_without_retry_after``, ``jobs_by_outcome``
  (``completed``, ``failed:<code>``, ``lost``, ``not_created``), ``by_behaviour``,
  ``ttl_sent``, ``ttl_expired``, ``lost_jobs`` (+ ``lost_examples``),
  ``idempotency_mismatches``, ``terminal_mismatches`` (client saw one terminal state, the
  database holds another), ``generator_errors`` (exceptions in the clients themselves);
- ``queue_time_s`` (``stage_durations.queue``), ``e2e_s`` (create sent → terminal seen,
  completed jobs), ``create_ms`` (async creates, refused included), ``create_p99_ms``,
  ``create_latency_max_ms``, ``status_read_ms`` and ``health_ms`` (prober, 200s only,
  during arrivals), ``poll_read_ms`` (the clients' own status reads), each
  ``{n, mean, max, p50, p95, p99}`` under the percentile rule; ``probe_errors``;
- ``eta_error_s``: for jobs whose create answered ``queued`` with an
  ``estimated_start_at``, |started_at − estimated_start_at| ``{n, median, p95, max}``,
  with ``null_estimates`` and ``field_present``; null when the server has no such field;
- ``rss_slope_mb_per_min`` per process (least squares over the level's samples after
  ``--slope-warmup`` of it), ``rss_end_mb``, ``gpu_memory_slope_mib_per_min`` (null
  without a GPU worker), ``queue_depth`` (``max``, ``mean``), ``in_flight_max``;
- ``end_state`` after settling: ``temp_dirs``, ``redis`` (``oq:*`` keys without TTL),
  ``s3`` (``open_multipart_uploads``, ``orphan_objects``), ``db_jobs_by_status``
  (cumulative over the run), ``worker_restarts`` (processes that appeared, by name);
- ``generator``: its CPU (% of one core), event-loop lag ms, prober ticks late;
- ``checks``: ``status_read_p99_le_50ms``, ``health_p99_le_50ms``,
  ``create_max_le_1s``, ``no_lost_jobs`` (null when a percentile is null).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from benchmarks.load.clients import JobRecord
from tests.loadgen.stats import TAIL_SAMPLES, percentiles, quantile


def outcome(r: JobRecord) -> str:
    """``completed``, ``failed:<code>``, ``lost`` (created, never seen to end) or
    ``not_created``."""
    if r.outcome == "failed":
        return f"failed:{r.error_code}"
    if r.outcome:
        return r.outcome
    return "lost" if r.job_id else "not_created"


def job_report(records: list[JobRecord], start: float, end: float) -> dict[str, Any]:
    """Throughput, outcomes, refusals and latencies of a level's jobs whose arrivals ran
    from ``start`` to ``end`` (monotonic seconds)."""
    duration = end - start
    completed = [r for r in records if r.outcome == "completed"]
    in_window = [r for r in completed if r.end_mono and r.end_mono <= end]
    last_end = max((r.end_mono for r in completed if r.end_mono), default=end)
    lost = [r for r in records if r.job_id and r.outcome is None]
    by_behaviour: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        by_behaviour[r.behaviour][outcome(r)] += 1
    create_p = percentiles([ms for r in records for ms in r.create_ms])
    return {
        "achieved_rps": round(len(in_window) / duration, 4),
        "completed_rps_with_settle": round(len(completed) / max(last_end - start, 1e-9), 4),
        "creates_by_http_status": dict(
            sorted(Counter(str(r.http_status or "none") for r in records).items())
        ),
        "refusals_by_code": dict(Counter(r.refusal for r in records if r.refusal)),
        "queue_full_refusals": sum(1 for r in records if r.refusal == "queue_full"),
        "queue_full_without_retry_after": sum(
            1 for r in records if r.refusal == "queue_full" and not r.retry_after
        ),
        "jobs_by_outcome": dict(Counter(outcome(r) for r in records)),
        "by_behaviour": {k: dict(v) for k, v in sorted(by_behaviour.items())},
        "ttl_sent": sum(1 for r in records if r.ttl is not None and r.job_id),
        "ttl_expired": sum(1 for r in records if r.error_code == "ttl_expired"),
        "lost_jobs": len(lost),
        "lost_examples": [f"{r.job_id} ({r.behaviour})" for r in lost[:10]],
        "idempotency_mismatches": sum(1 for r in records if r.idempotency_mismatch),
        "generator_errors": dict(Counter(r.client_error for r in records if r.client_error)),
        "queue_time_s": percentiles([r.queue_s for r in records if r.queue_s is not None], 3),
        "e2e_s": percentiles([r.e2e_s for r in completed if r.e2e_s is not None], 3),
        "create_ms": create_p,
        "create_p99_ms": create_p["p99"],
        "create_latency_max_ms": create_p["max"],
        "eta_error_s": eta_error(records),
    }


def eta_error(records: list[JobRecord]) -> dict[str, Any] | None:
    """|started_at − estimated_start_at| of jobs created ``queued`` with an estimate."""
    if not any(r.eta_field for r in records):
        return None
    queued = [r for r in records if r.eta_field and r.first_status == "queued"]
    errors = [
        abs(r.started_at - r.estimated_start_at)
        for r in queued
        if r.estimated_start_at is not None and r.started_at is not None
    ]
    return {
        "field_present": True,
        "n": len(errors),
        "null_estimates": sum(1 for r in queued if r.estimated_start_at is None),
        "never_started": sum(
            1 for r in queued if r.estimated_start_at is not None and r.started_at is None
        ),
        "median": round(statistics.median(errors), 2) if errors else None,
        "p95": round(quantile(errors, 0.95), 2) if len(errors) >= TAIL_SAMPLES / 0.05 else None,
        "max": round(max(errors), 2) if errors else None,
    }
