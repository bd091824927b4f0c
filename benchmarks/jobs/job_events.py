"""Job event fan-out: delivery latency of SSE events to 1 and to N watchers of one job.

    python -m benchmarks.jobs.job_events --watchers 100 --jobs 3

Starts its own embedded stack (``omniqueue up``), submits jobs, and follows each with
``--watchers`` concurrent SSE clients (plus a run with one watcher as the baseline). An
event's latency is its arrival at a watcher minus the moment Redis stored it (the stream
id's millisecond timestamp; same machine, same clock). Prints JSON with p50/p95/p99/max
per watcher count and the fan-out cost (p99 with N watchers − p99 with one).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import ROOT, parser, pct
from workers.runtime.processes import free_port


async def _watch(client: httpx.AsyncClient, vid: str, lat: list[float]) -> int:
    """Follow one job; only live events count (stored after this watcher connected):
    the retained history a late watcher replays is not fan-out latency."""
    count = 0
    async with client.stream("GET", f"/v1/videos/{vid}/events") as resp:
        connected = time.time()
        data = None
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                data = json.loads(line[6:])
            elif line == "" and data is not None:
                arrived = time.time()
                if not data["id"].startswith("0-"):
                    stored = int(data["id"].split("-")[0]) / 1000
                    if stored >= connected:
                        lat.append((arrived - stored) * 1000)
                count += 1
                if data["type"] == "done":
                    return count
                data = None
    return count


async def run(url: str, watchers: int, jobs: int, body: dict[str, Any]) -> dict[str, Any]:
    lat: list[float] = []
    limits = httpx.Limits(max_connections=watchers + 10)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        for _ in range(jobs):
            vid = (await client.post("/v1/videos", json=body)).json()["id"]
            counts = await asyncio.gather(*[_watch(client, vid, lat) for _ in range(watchers)])
            assert len(set(counts)) == 1, f"watchers saw different event counts: {set(counts)}"
    return {
        "watchers": watchers,
        "events_measured": len(lat),
        "latency_ms": {
            "p50": round(pct(lat, 0.5), 2),
            "p95": round(pct(lat, 0.95), 2),
            "p99": round(pct(lat, 0.99), 2),
            "max": round(max(lat), 2),
        },
    }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--watchers", type=int, default=100)
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="oq-events-bench-"))
    port = free_port()
    env = {**os.environ, "OMNIQ_WORKER__PROGRESS_INTERVAL_S": "0.05"}
    up = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    try:
        assert up.stdout is not None
        line = up.stdout.readline().decode()
        url = line.split("up: ", 1)[1].split()[0]
        body = {
            "prompt": "fan-out",
            "size": "320x192",
            "seconds": "1",
            "num_inference_steps": args.steps,
        }
        one = asyncio.run(run(url, 1, args.jobs, body))
        many = asyncio.run(run(url, args.watchers, args.jobs, body))
        print(
            json.dumps(
                {
                    "request": body,
                    "jobs": args.jobs,
                    "one_watcher": one,
                    "many_watchers": many,
                    "fan_out_cost_p99_ms": round(
                        many["latency_ms"]["p99"] - one["latency_ms"]["p99"], 2
                    ),
                },
                indent=2,
            )
        )
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
