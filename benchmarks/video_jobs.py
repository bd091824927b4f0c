"""Throughput and latency of video jobs against a running omniqueue (prints JSON).

    omniqueue up --workers 2 &
    python benchmarks/video_jobs.py --jobs 20 --size 320x192 --seconds 1 --steps 10

Reports create latency (HTTP round trip), end-to-end latency (create → completed, seen by
polling), the worker-side stage durations the API reports, and jobs per minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 4),
        "p50": round(_pct(values, 0.5), 4),
        "p95": round(_pct(values, 0.95), 4),
        "max": round(max(values), 4),
    }


def run_one(client: httpx.Client, body: dict[str, Any], poll_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    resp = client.post("/v1/videos", json=body)
    resp.raise_for_status()
    created = time.perf_counter()
    video = resp.json()
    while video["status"] not in ("completed", "failed"):
        time.sleep(poll_s)
        video = client.get(f"/v1/videos/{video['id']}").json()
    done = time.perf_counter()
    return {
        "create_s": created - t0,
        "end_to_end_s": done - t0,
        "status": video["status"],
        "stages": video["stage_durations"],
        "inference_time_s": video["inference_time_s"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--jobs", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--size", default="320x192")
    p.add_argument("--seconds", default="1")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--poll", type=float, default=0.1)
    args = p.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    body = {"prompt": "benchmark: a red ball over a blue sea", "size": args.size,
            "seconds": args.seconds, "num_inference_steps": args.steps}
    t0 = time.perf_counter()
    with httpx.Client(base_url=args.url, headers=headers, timeout=60) as client, \
            ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda _: run_one(client, body, args.poll), range(args.jobs)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == "completed"]
    stages = {k: _summary([r["stages"][k] for r in ok]) for k in ok[0]["stages"]} if ok else {}
    print(json.dumps({
        "jobs": args.jobs, "completed": len(ok), "concurrency": args.concurrency,
        "request": body, "wall_s": round(wall, 3),
        "jobs_per_minute": round(len(ok) / wall * 60, 2),
        "create_latency_s": _summary([r["create_s"] for r in results]),
        "end_to_end_s": _summary([r["end_to_end_s"] for r in ok]) if ok else None,
        "inference_time_s": _summary([r["inference_time_s"] for r in ok]) if ok else None,
        "stage_durations_s": stages,
    }, indent=2))


if __name__ == "__main__":
    main()
