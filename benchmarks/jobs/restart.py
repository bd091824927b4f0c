"""A worker told to stop mid-job, then started again (issue 34 §3; prints one JSON object).

    python -m benchmarks.jobs.restart              # 5 rounds
    python -m benchmarks.jobs.restart --rounds 2   # a quick run

Starts ``python -m cli.main up`` with one job worker, whose jobs pause in their first
attempt's step 1 (a failpoint, so each is mid-denoise when the worker is told to stop).
Each round submits a job, waits for that pause, sends the worker process SIGTERM (what
``up`` sends it on Ctrl-C, and ``docker compose stop``) and measures:

* ``released_s``: SIGTERM → the job reads ``queued`` (``GET /v1/videos/{id}``, polled
  every 20 ms): the worker stopped it, put it back and sent its message again;
* ``worker_exit_s``: SIGTERM → the worker process is gone;
* ``restart_to_taken_s``: the new worker process's start (``up`` restarts it; its
  ``create_time``) → the job reads ``in_progress`` again: what the issue's target
  (≤ 2 s) is about, a worker's whole start-up (Python, torch, the models, Celery)
  included;
* the job then runs to the end (attempt 2), checked.

* ``stop_to_taken_s``: SIGTERM → the job reads ``in_progress`` again, the whole cycle:
  the worker exits 0 (it was told to stop), ``up``'s supervisor starts it again in the
  same tick (a clean stop is no failure: no backoff), and the new process takes the job.
"""

from __future__ import annotations

import json
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.common import parser
from benchmarks.embedded_stack import Stack, report, say

JOB = {"prompt": "a red kite", "size": "64x48", "seconds": "0.5", "num_inference_steps": 4}
POLL_S = 0.02


def _status(client: httpx.Client, job_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/v1/videos/{job_id}").json()
    return body


def _until(client: httpx.Client, job_id: str, pred: Any, timeout: float = 120) -> float:
    """Poll the job until ``pred(body)``; the wall time when it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred(_status(client, job_id)):
            return time.time()
        time.sleep(POLL_S)
    raise RuntimeError(f"job {job_id}: condition not met in {timeout:.0f} s")


def _worker(stack: Stack, other_than: int | None = None, timeout: float = 120) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in stack.children()["worker"]:
            if proc.pid != other_than:
                return proc
        time.sleep(POLL_S)
    raise RuntimeError("no worker process")


def _round(stack: Stack, client: httpx.Client) -> dict[str, float]:
    job = client.post("/v1/videos", json=JOB).json()
    job_id = job["id"]
    _until(client, job_id, lambda b: b["status"] == "in_progress" and b["step"] >= 1)
    time.sleep(0.3)  # at the failpoint's pause in step 1
    old = _worker(stack)
    sent = time.time()
    old.send_signal(signal.SIGTERM)
    released = _until(client, job_id, lambda b: b["status"] == "queued")
    old.wait(60)
    gone = time.time()
    new = _worker(stack, other_than=old.pid)
    taken = _until(client, job_id, lambda b: b["status"] != "queued")
    done = _status(client, job_id)
    while done["status"] not in ("completed", "failed"):
        time.sleep(0.1)
        done = _status(client, job_id)
    if done["status"] != "completed" or done["attempt"] != 2:
        raise RuntimeError(f"job {job_id} did not complete as attempt 2: {done}")
    return {
        "released_s": round(released - sent, 3),
        "worker_exit_s": round(gone - sent, 3),
        "restart_to_taken_s": round(taken - new.create_time(), 3),
        "stop_to_taken_s": round(taken - sent, 3),
    }


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    points = Path(tempfile.mkdtemp(prefix="oq-restart-")) / "failpoints.json"
    points.write_text(json.dumps({"step:1@attempt1": "pause"}))
    stack = Stack(
        workers=1,
        env={"OMNIQ_WORKER__FAILPOINTS_FILE": str(points)},
        args=("--realtime-workers", "0"),
    )
    out: dict[str, Any] = {"benchmark": "worker_restart", "rounds": args.rounds}
    rounds: list[dict[str, float]] = []
    with stack.running(out), httpx.Client(base_url=stack.url, timeout=30) as client:
        for i in range(args.rounds):
            rounds.append(_round(stack, client))
            say(f"round {i + 1}: {rounds[-1]}")
    out["runs"] = rounds
    for key in ("released_s", "worker_exit_s", "restart_to_taken_s", "stop_to_taken_s"):
        values = [r[key] for r in rounds]
        out[key] = {"median": statistics.median(values), "max": max(values)}
    out["target_restart_to_taken_s"] = 2.0
    out["meets_target"] = out["restart_to_taken_s"]["max"] <= 2.0
    return report(out)


if __name__ == "__main__":
    raise SystemExit(main())
