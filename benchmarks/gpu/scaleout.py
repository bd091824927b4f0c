"""N single-GPU workers against one: jobs per minute of fixed-shape jobs through the whole
stack (``omniqueue up --worker-devices cuda:0,…``), Wan2.1-T2V-1.3B architecture with
random bf16 weights.

    python -m benchmarks.gpu.scaleout --gpus 2 --jobs-per-worker 4 --frames 33 --steps 20
    python -m benchmarks.gpu.scaleout --device cpu --gpus 2 --layers 2 --height 64 \\
        --width 64 --frames 5 --steps 2 --jobs-per-worker 2          # a smoke run on CPUs

For 1 worker and then ``--gpus`` workers (worker i on ``cuda:i``): every worker runs one
warm-up job, then ``jobs-per-worker`` × workers jobs are submitted at once and each is
followed to ``completed``; jobs per minute = jobs ÷ (last completion − first submit).
``scaleout_N_workers`` is the ratio. Queue routing and prefetch decide whether the
workers overlap: each worker holds at most one unacknowledged job (prefetch 1, late
acks), so a job waits for the first free worker, not behind a busy one.

Prints one JSON object (also ``$OUT/gpu_scaleout.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from benchmarks.common import parser
from benchmarks.embedded_stack import Stack, say
from benchmarks.gpu.common import (
    MODEL,
    emit,
    follow_events,
    header,
    job_body,
    save_wan,
    shape_args,
)


def _run(url: str, body: dict[str, Any]) -> float:
    """One job to completion; the time it completed."""
    with httpx.Client(base_url=url, timeout=3600) as client:
        resp = client.post("/v1/videos", json=body)
        resp.raise_for_status()
        done = follow_events(client, resp.json()["id"])
        if done.get("status") != "completed":
            raise RuntimeError(f"{resp.json()['id']}: {done}")
        return time.perf_counter()


def measure(workers: int, registry: Path, args: argparse.Namespace) -> dict[str, Any]:
    devices = ",".join(f"cuda:{i}" if args.device == "cuda" else "cpu" for i in range(workers))
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_MODELS": MODEL,
        "OMNIQ_WORKER__PREVIEW_EVERY": "0",
    }
    stack = Stack(
        workers=workers, env=env, args=("--worker-devices", devices, "--realtime-workers", "0")
    )
    stack.start(timeout=900)
    body = job_body(args)
    count = workers * args.jobs_per_worker
    try:
        with ThreadPoolExecutor(max_workers=count) as pool:
            list(pool.map(lambda i: _run(stack.url, {**body, "seed": i}), range(workers)))
            start = time.perf_counter()
            ends = list(
                pool.map(lambda i: _run(stack.url, {**body, "seed": 100 + i}), range(count))
            )
        wall = max(ends) - start
    finally:
        code = stack.stop()
        stack.remove()
    return {
        "workers": workers,
        "devices": devices,
        "jobs": count,
        "wall_s": round(wall, 2),
        "jobs_per_min": round(count / wall * 60, 3),
        "up_exit_code": code,
    }


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--jobs-per-worker", type=int, default=4)
    shape_args(p)
    args = p.parse_args()
    cuda = args.device == "cuda"
    out = header(args)
    if cuda and torch.cuda.device_count() < args.gpus:
        out["error"] = f"{args.gpus} GPUs asked for, {torch.cuda.device_count()} visible"
        print(json.dumps(out, indent=2))
        return 1
    _, registry = save_wan(Path(tempfile.mkdtemp(prefix="oq-gpu-scale-")), args)
    runs = []
    for workers in (1, args.gpus):
        say(f"{workers} worker(s)")
        runs.append(measure(workers, registry, args))
    out["runs"] = runs
    out[f"scaleout_{args.gpus}_workers"] = round(
        runs[1]["jobs_per_min"] / runs[0]["jobs_per_min"], 3
    )
    emit(out, "gpu_scaleout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
