"""Faults between hosts, each injected while a mixed load runs (video jobs watched over
SSE, a duplex voice session, a world session: ``tests/cluster/load.py``), each
checked the same way afterwards (``tests/cluster/checks.py``): every job in exactly one
terminal state, complete and unique objects, nothing left behind, no answer past its
deadline. The cluster: ``tests/cluster/cluster.py``. What each shows and the bounds:
docs/deployment.md, "Failures between hosts".
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.cluster.checks import check_jobs, metric, wait_running, wait_taken
from tests.cluster.cluster import JOB_HOSTS, Cluster
from tests.cluster.conftest import BROKER_DOWN_S, SLOW_LINK_S
from tests.cluster.load import DEADLINE_S, JobLoad, Sessions

pytestmark = pytest.mark.cluster

HEALED_TAKES_JOBS_S = 30.0  # a healed worker takes new jobs within this
# Take-over bound: OMNIQ_WORKER__HEARTBEAT_TIMEOUT_S (8) + a reconciler pass (2) + a claim.
TAKEOVER_BOUND_S = 8 + 2 + 10


def _other_worker(host: str) -> str:
    return JOB_HOSTS[1 - JOB_HOSTS.index(host)]


def _slow_job(cluster: Cluster, load: JobLoad, seconds: float | None = None) -> tuple[str, str]:
    """A job that stays in its denoise loop (a failpoint before its step 2, on its first
    attempt only) for about ``seconds``, or until :func:`_release` when None, running;
    its id and its worker's host. The load starts once it runs: on a loaded machine its
    jobs queued ahead of this one kept it from starting within a minute."""
    job_id = load.create("api1", num_inference_steps=8)
    assert job_id is not None
    action = "hold" if seconds is None else f"sleep:{seconds}"
    cluster.set_failpoints({f"step:2@{job_id}@attempt1": action})
    started = wait_running(cluster, job_id, step=1, timeout=90)
    load.start()  # the load's jobs after it, not ahead of it in the queue
    return job_id, started


def _release(cluster: Cluster) -> None:
    """Every ``hold`` failpoint lets its worker go on (``workers/common/failpoints.py``)."""
    cluster.set_failpoints({})


def _attempt_after(cluster: Cluster, job_id: str, attempt: int, timeout: float) -> float:
    """Seconds until ``job_id`` runs (or ran) attempt ``attempt`` or later."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        (row,) = cluster.rows("SELECT attempt FROM jobs WHERE id = :id", id=job_id)
        if row.attempt >= attempt:
            return round(time.monotonic() - t, 2)
        time.sleep(0.2)
    raise AssertionError(f"{job_id} was not taken over within {timeout} s")


def _takes_jobs(cluster: Cluster, load: JobLoad, host: str) -> float:
    """Seconds until ``host``'s worker runs a new job: pairs of jobs, so that the other
    worker, busy with one, leaves it the other."""
    t = time.monotonic()
    while time.monotonic() - t < HEALED_TAKES_JOBS_S + 30:
        ids = [load.create("api2", num_inference_steps=16) for _ in range(2)]
        for job_id in ids:
            assert job_id is not None
            if wait_taken(cluster, job_id) == host:
                return round(time.monotonic() - t, 2)
    raise AssertionError(f"{host} took no job after it was healed")


def _finish(cluster: Cluster, load: JobLoad, sessions: Sessions | None = None) -> dict[str, Any]:
    figures = load.finish()
    if sessions is not None:
        figures["sessions"] = sessions.finish()
    figures["checks"] = check_jobs(cluster, load.jobs)
    assert figures["max_answer_s"] < DEADLINE_S, figures
    assert "ReadTimeout" not in figures["answer_errors"], figures
    return figures


def test_a_workers_broker_link_goes_down_mid_job(cluster: Cluster, report: dict[str, Any]) -> None:
    load = JobLoad(cluster)
    sessions = Sessions(cluster).start()
    job_id, host = _slow_job(cluster, load, seconds=3)  # it ends while the link is down
    reconnects = metric(cluster, host, "omniqueue_broker_reconnects_total")
    cluster.net.set_link(host, "redis", False)
    time.sleep(BROKER_DOWN_S)
    cluster.net.set_link(host, "redis", True)
    figures: dict[str, Any] = {"host": host, "down_s": BROKER_DOWN_S}
    figures["healed_takes_jobs_s"] = _takes_jobs(cluster, load, host)
    assert figures["healed_takes_jobs_s"] <= HEALED_TAKES_JOBS_S
    figures |= _finish(cluster, load, sessions)
    (row,) = cluster.rows("SELECT status, attempt FROM jobs WHERE id = :id", id=job_id)
    figures["job"] = {"status": row.status, "attempt": row.attempt}
    figures["broker_reconnects"] = metric(cluster, host, "omniqueue_broker_reconnects_total")
    assert figures["broker_reconnects"] > reconnects  # the metrics show the fault
    report["1_broker_link"] = figures


def test_a_worker_cut_from_postgres_then_from_s3(cluster: Cluster, report: dict[str, Any]) -> None:
    load = JobLoad(cluster)
    sessions = Sessions(cluster).start()
    # PostgreSQL, mid-job: its heartbeat lapses and the other worker takes the job over.
    # The cut worker stays in its step until the link is back (a hold, not a sleep sized
    # to outlast the take-over), then goes on with a job that is no longer its.
    job_id, host = _slow_job(cluster, load)
    takeovers = metric(cluster, _other_worker(host), "omniqueue_job_takeovers_total")
    cluster.net.set_link(host, "postgres", False)
    figures: dict[str, Any] = {"postgres": {"host": host}}
    figures["postgres"]["takeover_s"] = _attempt_after(cluster, job_id, 2, TAKEOVER_BOUND_S)
    cluster.net.set_link(host, "postgres", True)
    _release(cluster)
    figures["postgres"]["healed_takes_jobs_s"] = _takes_jobs(cluster, load, host)
    assert figures["postgres"]["healed_takes_jobs_s"] <= HEALED_TAKES_JOBS_S
    later = metric(cluster, _other_worker(host), "omniqueue_job_takeovers_total")
    assert later > takeovers  # the metrics show the fault
    # S3, during the upload: the link is down for longer than the upload's retries.
    upload = load.create("api2")
    assert upload is not None
    cluster.set_failpoints({f"upload@{upload}": "sleep:2"})
    since = {h: cluster.log_offset(h) for h in JOB_HOSTS}
    host = next(
        h
        for h in _poll_logs(cluster, since, f"failpoint upload@{upload}: sleep:2", upload)
        if h in JOB_HOSTS
    )
    cluster.net.set_link(host, "s3", False)
    time.sleep(15)
    cluster.net.set_link(host, "s3", True)
    figures |= _finish(cluster, load, sessions)
    (row,) = cluster.rows("SELECT status, error_code FROM jobs WHERE id = :id", id=upload)
    figures["s3"] = {"host": host, "job": f"{row.status}:{row.error_code or ''}"}
    report["2_postgres_then_s3"] = figures


def _poll_logs(
    cluster: Cluster, since: dict[str, int], needle: str, job_id: str | None = None
) -> list[str]:
    """The hosts whose log has ``needle`` since ``since``; the failure names where
    ``job_id`` stood (its row), so that a job that never reached the line says why."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = [
            h
            for h, offset in since.items()
            if needle in (cluster.work / f"{h}.log").read_bytes()[offset:].decode(errors="replace")
        ]
        if found:
            return found
        time.sleep(0.1)
    where = ""
    if job_id is not None:
        (row,) = cluster.rows(
            "SELECT status, attempt, error_code FROM jobs WHERE id = :id", id=job_id
        )
        where = f"; the job: {row.status}, attempt {row.attempt}, error {row.error_code}"
    raise AssertionError(f"{needle!r} in no log{where}")


def test_a_zombie_worker_writes_nothing(cluster: Cluster, report: dict[str, Any]) -> None:
    """Fencing by attempt number (docs/deployment.md): the isolated worker, back after the
    other took its job over and completed it, adds no row change, object, event or
    webhook."""
    load = JobLoad(cluster).start()
    sessions = Sessions(cluster).start()
    job_id = load.create("api1")
    assert job_id is not None
    cluster.set_failpoints({f"upload@{job_id}@attempt1": "hold"})
    since = {h: cluster.log_offset(h) for h in JOB_HOSTS}
    (host,) = _poll_logs(cluster, since, f"failpoint upload@{job_id}@attempt1", job_id)
    cluster.net.isolate(host)
    isolated = time.monotonic()
    figures: dict[str, Any] = {"host": host}
    figures["takeover_s"] = _attempt_after(cluster, job_id, 2, TAKEOVER_BOUND_S)
    while cluster.rows("SELECT status FROM jobs WHERE id = :id", id=job_id)[0].status != (
        "completed"
    ):
        assert time.monotonic() - isolated < 60
        time.sleep(0.2)
    cluster.net.heal(host)
    _release(cluster)
    # the zombie wakes (healed, after the other worker completed its job), uploads, learns
    # it lost the job (or finds its database connections dead first), and ends its run
    ended = cluster.wait_log(host, f"job {job_id}: ", since=since[host], timeout=60)
    figures["zombie_outcome"] = ended.split(f"job {job_id}: ", 1)[1].split()[0]
    figures["healed_takes_jobs_s"] = _takes_jobs(cluster, load, host)
    assert figures["healed_takes_jobs_s"] <= HEALED_TAKES_JOBS_S
    figures |= _finish(cluster, load, sessions)
    (row,) = cluster.rows("SELECT status, attempt, worker_id FROM jobs WHERE id = :id", id=job_id)
    assert (row.status, row.attempt) == ("completed", 2)
    assert row.worker_id.endswith(_other_worker(host))
    report["3_zombie"] = figures


def _resumed_whole(voice: dict[str, Any]) -> None:
    """The duplex voice session resumed on the other API host, with no event missing or
    repeated and no answer short of audio."""
    assert voice["resumes_s"] and not voice["resync_required"], voice
    assert voice["events_lost"] == 0 and voice["duplicates"] == 0, voice
    assert voice["audio_ms_lost"] == 0, voice


def test_an_api_host_cut_from_redis(cluster: Cluster, report: dict[str, Any]) -> None:
    load = JobLoad(cluster).start()
    sessions = Sessions(cluster).start()  # both sessions on api1
    watched = load.create("api2")  # created on api2, so its SSE watcher is on api1
    assert watched is not None
    cluster.set_failpoints({f"step:2@{watched}@attempt1": "sleep:12"})  # it runs on
    wait_running(cluster, watched, step=1)
    cut_at = time.time()
    cluster.net.set_link("api1", "redis", False)
    time.sleep(15)
    cluster.net.set_link("api1", "redis", True)
    figures = _finish(cluster, load, sessions)
    report["4_api_cut_from_redis"] = figures
    voice, video = figures["sessions"]["voice"], figures["sessions"]["video"]
    # how long the client's socket stayed open after the cut (the relay's bound, 5 s)
    voice["closed_after_cut_s"] = [round(t - cut_at, 2) for t in voice.pop("broke_at")]
    assert figures["sse_resumes"] > 0  # the SSE watchers moved to api2
    assert video["resumes_s"] and video["chunks_lost"] == 0 and video["duplicates"] == 0
    # The cut replica sent nothing it could not store and closed the socket 1012: the
    # session resumed on api2, every event once, every answer whole.
    assert 1012 in voice["close_codes"], voice
    _resumed_whole(voice)


def test_a_host_vanishes(cluster: Cluster, report: dict[str, Any]) -> None:
    load = JobLoad(cluster)
    sessions = Sessions(cluster).start()
    # a worker host, mid-job
    job_id, host = _slow_job(cluster, load)  # held until the host is gone
    cluster.vanish(host)
    figures: dict[str, Any] = {"worker": {"host": host}}
    figures["worker"]["takeover_s"] = _attempt_after(cluster, job_id, 2, TAKEOVER_BOUND_S)
    cluster.net.heal(host)
    cluster.start_process(host, "worker", "--name", host)
    # an API host, serving SSE watchers and both sessions
    time.sleep(2)
    cluster.vanish("api1")
    time.sleep(5)
    cluster.net.heal("api1")
    cluster.start_api("api1")
    cluster.wait_api("api1")
    figures |= _finish(cluster, load, sessions)
    report["5_host_vanishes"] = figures
    voice, video = figures["sessions"]["voice"], figures["sessions"]["video"]
    assert figures["sse_resumes"] > 0, figures
    assert video["resumes_s"] and video["chunks_lost"] == 0 and video["duplicates"] == 0, video
    _resumed_whole(voice)


def test_slow_links_to_the_services(cluster: Cluster, report: dict[str, Any]) -> None:
    load = JobLoad(cluster, every_s=2.0).start()
    sessions = Sessions(cluster).start()
    cluster.set_delay(0.2)
    time.sleep(SLOW_LINK_S)
    cluster.set_delay(0)
    figures = _finish(cluster, load, sessions)
    figures["delay_ms_each_way"] = 200
    figures["slow_s"] = SLOW_LINK_S
    report["6_slow_links"] = figures
