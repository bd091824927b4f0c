"""Throughput and latency of video jobs against a running omniqueue (prints JSON).

    omniqueue up --workers 2 &
    python -m benchmarks.jobs.video_jobs --jobs 20 --size 320x192 --seconds 1 --steps 10

Reports create latency (HTTP round trip), end-to-end latency (create → completed, seen by
polling), the worker-side stage durations the API reports, and jobs per minute.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from benchmarks.common import parser, summary


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
    p = parser(__doc__)
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
    body = {
        "prompt": "benchmark: a red ball over a blue sea",
        "size": args.size,
        "seconds": args.seconds,
        "num_inference_steps": args.steps,
    }
    t0 = time.perf_counter()
    with (
        httpx.Client(base_url=args.url, headers=headers, timeout=60) as client,
        ThreadPoolExecutor(args.concurrency) as pool,
    ):
        results = list(pool.map(lambda _: run_one(client, body, args.poll), range(args.jobs)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == "completed"]
    stages = {k: summary([r["stages"][k] for r in ok], 4) for k in ok[0]["stages"]} if ok else {}
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "completed": len(ok),
                "concurrency": args.concurrency,
                "request": body,
                "wall_s": round(wall, 3),
                "jobs_per_minute": round(len(ok) / wall * 60, 2),
                "create_latency_s": summary([r["create_s"] for r in results], digits=4),
                "end_to_end_s": summary([r["end_to_end_s"] for r in ok], digits=4) if ok else None,
                "inference_time_s": summary([r["inference_time_s"] for r in ok], digits=4)
                if ok
                else None,
                "stage_durations_s": stages,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
