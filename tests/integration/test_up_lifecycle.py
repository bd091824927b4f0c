"""``omniqueue up``: one command runs everything, stops everything, and keeps its data.
(What it restarts: test_up_supervision.py; its options: test_up_options.py.)"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.up_process import (
    SMALL_JOB,
    Up,
    alive,
    port_free,
    said_ready,
    video_status,
    wait_for,
)
from workers.runtime.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_up_runs_stops_cleanly_and_keeps_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    up = Up(data_dir, port)
    # "is up" once the workers take jobs (it came seconds before them): Celery says its
    # "ready." just after the signal that writes the status file up waits on
    deadline = time.monotonic() + 1
    while not said_ready(up, "embedded-0", "embedded-rt"):
        assert time.monotonic() < deadline, up.log.read_text()[-4000:]
        time.sleep(0.05)
    assert re.search(r"embedded-0@\S+ ready\.", (data_dir / "logs" / "worker-0.log").read_text())
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            assert c.get("/ready").status_code == 200
            video = c.post(
                "/v1/videos",
                json={
                    "prompt": "a green kite",
                    "size": "64x48",
                    "seconds": "0.5",
                    "num_inference_steps": 3,
                },
            ).json()
            deadline = time.monotonic() + 120
            while c.get(f"/v1/videos/{video['id']}").json()["status"] != "completed":
                assert time.monotonic() < deadline, up.log.read_text()[-4000:]
                time.sleep(0.2)
            first = c.get(f"/v1/videos/{video['id']}/content").content
    finally:
        code, tree, ports = up.stop(signal.SIGTERM)
    assert code == 0
    assert len(tree) >= 4  # valkey, weed, api, worker (at least)
    assert port in ports and len(ports) >= 3
    leftovers = [pid for pid in tree if alive(pid)]
    assert leftovers == [], "orphan processes after SIGTERM"
    assert [p for p in ports if not port_free(p)] == []
    assert (data_dir / "omniqueue.db").exists()
    log = up.log.read_text()
    # quiet: no Alembic line per revision, no Celery banner against root (the suite runs
    # as root here), no line per /health poll
    assert "INFO alembic" not in log and "Running upgrade" not in log, log[:4000]
    assert "superuser privileges" not in log and "HTTP Request:" not in log, log[:4000]

    again = Up(data_dir, port)
    try:
        with httpx.Client(base_url=again.url, timeout=30) as c:
            kept = c.get(f"/v1/videos/{video['id']}").json()
            assert kept["status"] == "completed"
            assert c.get(f"/v1/videos/{video['id']}/content").content == first
    finally:
        code, tree, _ = again.stop(signal.SIGINT)
    assert code == 0
    assert [pid for pid in tree if alive(pid)] == []


def test_ctrl_c_with_a_job_running_puts_it_back_and_the_next_up_runs_it(tmp_path: Path) -> None:
    """Ctrl-C of ``up`` mid-job: the worker puts the job back (``queued`` in the database
    once ``up`` has exited, not a stale ``in_progress``) instead of being killed after the
    grace; the next ``up`` runs it to the end at once, as attempt 2."""
    import sqlite3

    data_dir = tmp_path / "data"
    port = free_port()
    points = tmp_path / "failpoints.json"
    points.write_text(json.dumps({"step:1@attempt1": "pause"}))
    up = Up(data_dir, port, {"OMNIQ_WORKER__FAILPOINTS_FILE": str(points)})
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()
            wait_for(lambda: video_status(c, video["id"])["status"] == "in_progress", "running", up)
            wait_for(lambda: "failpoint step:1@attempt1: pause" in up.log.read_text(), "paused", up)
    finally:
        code, _, _ = up.stop(signal.SIGINT)
    assert code == 0
    log = up.log.read_text()
    assert f"job {video['id']}: released" in log and "did not stop within" not in log, log[-4000:]
    with sqlite3.connect(data_dir / "omniqueue.db") as db:
        row = db.execute("SELECT status, worker_id FROM jobs WHERE id = ?", (video["id"],))
        assert row.fetchone() == ("queued", None)
    points.write_text("{}")
    again = Up(data_dir, port, {"OMNIQ_WORKER__FAILPOINTS_FILE": str(points)})
    try:
        with httpx.Client(base_url=again.url, timeout=30) as c:
            wait_for(
                lambda: video_status(c, video["id"])["status"] == "completed", "completed", again
            )
            assert video_status(c, video["id"])["attempt"] == 2
    finally:
        code, _, _ = again.stop(signal.SIGTERM)
    assert code == 0


def test_stop_with_an_open_sse_stream_lets_the_api_exit_gracefully(tmp_path: Path) -> None:
    # No job worker: the job stays queued, so its event stream stays open.
    up = Up(tmp_path / "data", free_port(), workers=0)
    stream_ended = threading.Event()
    opened = threading.Event()
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            api = up.child("api")

            def follow() -> None:
                try:
                    with c.stream("GET", f"/v1/videos/{video}/events") as resp:
                        assert resp.status_code == 200
                        for _ in resp.iter_raw():
                            opened.set()
                except httpx.HTTPError:
                    pass
                stream_ended.set()

            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            assert opened.wait(30), up.log.read_text()[-4000:]
            started = time.monotonic()
            code, tree, _ = up.stop(signal.SIGTERM)
            took = time.monotonic() - started
            reader.join(5)
    finally:
        if up.proc.poll() is None:
            up.stop(signal.SIGKILL)
    log = up.log.read_text()
    assert code == 0
    assert stream_ended.is_set()
    assert "api did not stop" not in log, log[-4000:]  # not SIGKILLed...
    assert f"Finished server process [{api}]" in log  # ...uvicorn finished its shutdown
    assert took < 10 + 5  # the child stop timeout, plus valkey's and weed's own stop
    assert [pid for pid in tree if alive(pid)] == []
