"""A small tenant's time to start under a flood, with fair share on and off (prints one
JSON object on stdout).

    python -m benchmarks.jobs.fair_share                  # a 200-job flood, 5 small jobs
    python -m benchmarks.jobs.fair_share --flood 50 --small 3

For each mode (``OMNIQ_QUOTAS__FAIR_SHARE=true``, then ``false``) it starts a fresh
embedded stack (``omniqueue up`` with keys required, one job worker, no realtime worker)
in its own temporary data directory, creates two keys, and has the ``flood`` key submit
``--flood`` tiny jobs (64x48, 8 frames, 1 step). Once the worker runs the first of them,
the ``small`` key submits one job, waits until it has started, and submits the next,
``--small`` times (fair share off: once, since it waits for the whole flood). Time to
start is ``started_at - created_at`` of the small job's row (the database's own clock,
read from the embedded SQLite file), and the flood jobs started in between are counted.
The flood still queued afterwards is cancelled, the stack stopped and its data removed.
Progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import machine, parser, summary
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.keys import ApiKeyStore
from storage.settings import DatabaseSettings
from tests.embedded_up import start_up, stop_up

TINY = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 1}


def _say(text: str) -> None:
    print(f"[fair_share] {text}", file=sys.stderr, flush=True)


def _wait_status(client: httpx.Client, job_id: str, leave: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/v1/videos/{job_id}").json()
        if body["status"] != leave:
            return body
        time.sleep(0.02)
    raise SystemExit(f"{job_id} still {leave} after {timeout:g} s")


def run_mode(fair: bool, flood: int, small: int, timeout: float) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="oq-fair-"))
    env = {
        "OMNIQ_AUTH": "required",
        "OMNIQ_QUOTAS__FAIR_SHARE": "true" if fair else "false",
    }
    up, url = start_up(data_dir, env=env, args=["--workers", "1", "--realtime-workers", "0"])
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{data_dir / 'omniqueue.db'}"))
    try:
        keys = ApiKeyStore(make_sessionmaker(engine))
        flood_secret = keys.create("flood")[1]
        small_secret = keys.create("small")[1]
        jobs = JobStore(make_sessionmaker(engine))
        auth = {"Authorization": f"Bearer {flood_secret}"}
        with (
            httpx.Client(base_url=url, headers=auth, timeout=60, trust_env=False) as fc,
            httpx.Client(
                base_url=url,
                headers={"Authorization": f"Bearer {small_secret}"},
                timeout=60,
                trust_env=False,
            ) as sc,
        ):
            flooded = []
            for _ in range(flood):
                resp = fc.post("/v1/videos", json={"prompt": "flood", **TINY})
                resp.raise_for_status()
                flooded.append(resp.json()["id"])
            _say(f"fair_share={fair}: {flood} flood jobs queued")
            _wait_status(fc, flooded[0], "queued", timeout)
            samples = []
            for i in range(small if fair else 1):
                resp = sc.post("/v1/videos", json={"prompt": "small", **TINY})
                resp.raise_for_status()
                created = resp.json()
                _wait_status(sc, created["id"], "queued", timeout)
                row = jobs.read(created["id"])
                assert row is not None and row.started_at is not None
                before = [jobs.read(j) for j in flooded]
                overtaking = sum(
                    1
                    for r in before
                    if r is not None
                    and r.started_at is not None
                    and row.created_at <= r.started_at < row.started_at
                )
                samples.append(
                    {
                        "time_to_start_s": round(row.started_at - row.created_at, 3),
                        "queue_position_at_create": created["queue_position"],
                        "flood_jobs_started_meanwhile": overtaking,
                    }
                )
                _say(f"fair_share={fair}: small job {i}: {samples[-1]}")
            rows = [jobs.read(j) for j in flooded]
            ran = [r for r in rows if r is not None and r.completed_at and r.started_at]
            durations = [r.completed_at - r.started_at for r in ran]
            for job_id in flooded:  # what is still queued: cancelled, not waited for
                fc.post(f"/v1/videos/{job_id}/cancel")
        return {
            "fair_share": fair,
            "small_jobs": samples,
            "time_to_start_s": summary([s["time_to_start_s"] for s in samples], 3),
            "flood_job_run_s": summary(durations, 3),
            "flood_jobs_run_before_stop": len(ran),
        }
    finally:
        engine.dispose()
        stop_up(up, data_dir)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--flood", type=int, default=200)
    p.add_argument("--small", type=int, default=5)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per wait")
    p.add_argument("--only", choices=("on", "off"), default=None, help="run one mode")
    args = p.parse_args()
    modes = [m == "on" for m in ("on", "off") if args.only in (None, m)]
    results = [run_mode(fair, args.flood, args.small, args.timeout) for fair in modes]
    report = {
        "benchmark": "fair_share",
        "flood_jobs": args.flood,
        "job": TINY,
        "workers": 1,
        "machine": machine(),
        "cpu_count": os.cpu_count(),
        "modes": results,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
