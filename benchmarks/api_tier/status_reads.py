"""Status reads, list pages and creates under concurrency, and the overhead of ``/sync``.

    python -m benchmarks.api_tier.status_reads --out docs/evidence/status_reads.json
    python -m benchmarks.api_tier.status_reads --database-url postgresql+psycopg://postgres@127.0.0.1/bench
    python -m benchmarks.api_tier.status_reads --skip-ab --sync-jobs 40  # only /sync's overhead
    OMNIQ_METRICS__ENABLED=false python -m benchmarks.api_tier.status_reads --reads-only  # A/B

Starts its own embedded stack (``omniqueue up``, one worker, no realtime worker) for each
database: SQLite in the data dir, then the ``--database-url`` ones (an empty PostgreSQL
database each; ``up`` migrates it). It creates ``--jobs`` small jobs, then runs ApacheBench
(``ab -k``, a C load generator; the same tool the issue measured with) for

- ``GET /v1/videos/{id}`` (``-c 50``), ``GET /v1/videos?limit=20`` (``-c 50``),
- ``POST /v1/videos`` with a JSON body (``-c 20``; last, nobody waits for these jobs), once
  with the worker running those jobs on the same cores and once with it frozen (SIGSTOP:
  the API tier alone, as where workers run on GPU hosts),

and, with ``--sync-jobs N``, N sequential ``POST /v1/videos/sync`` (320x192, 1 s, 4 steps,
idle worker) and as many create + SSE ``/events`` runs: overhead = wall time − the worker's
stages (prepare … upload, from ``stage_durations``). Prints JSON (req/s, p50, p99 per
endpoint and database).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.common import command_line, emit, parser, summary
from tests.embedded_up import start_up

TINY = {"prompt": "status bench", "size": "64x48", "seconds": "0.5", "fps": 16}
SYNC = {"prompt": "sync bench", "size": "320x192", "seconds": "1", "num_inference_steps": 4}
WORKER_STAGES = ("prepare", "denoise", "decode", "encode", "upload")


def _need_ab() -> str:
    ab = shutil.which("ab")
    if ab is None:
        raise SystemExit(
            "status_reads.py needs ApacheBench ('ab'): apt-get install apache2-utils "
            "(Debian/Ubuntu), dnf install httpd-tools (Fedora), brew install httpd (macOS)"
        )
    return ab


def _children(up: subprocess.Popen[bytes], command: str) -> list[psutil.Process]:
    """The ``omniqueue <command>`` children of ``omniqueue up`` (``api``, ``worker``)."""
    found = [
        child
        for child in psutil.Process(up.pid).children(recursive=True)
        if command in child.cmdline()[3:4]
    ]
    if not found:
        raise SystemExit(f"no 'omniqueue {command}' process under omniqueue up")
    return found


def _api_processes(up: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The ``omniqueue api`` children of ``omniqueue up`` (``--api-processes``)."""
    return _children(up, "api")


def _cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        times = proc.cpu_times()
        total += float(times.user + times.system)
    return total


def _ab(
    ab: str,
    url: str,
    *,
    n: int,
    c: int,
    api: list[psutil.Process],
    body: Path | None = None,
) -> dict[str, Any]:
    """One ``ab -k`` run: req/s, p50/p99 (ms), non-2xx and failed counts, and the API
    process's CPU time per request (less sensitive than req/s to other load)."""
    cmd = [ab, "-k", "-q", "-c", str(c), "-n", str(n), "-s", "60"]
    if body is not None:
        cmd += ["-p", str(body), "-T", "application/json"]
    cpu = _cpu_s(api)
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=False).stdout
    cpu = _cpu_s(api) - cpu

    def grab(pattern: str) -> float | None:
        m = re.search(pattern, out, re.M)
        return float(m.group(1)) if m else None

    return {
        "concurrency": c,
        "requests": n,
        "req_per_s": grab(r"^Requests per second:\s+([\d.]+)"),
        "p50_ms": grab(r"^\s+50%\s+(\d+)"),
        "p99_ms": grab(r"^\s+99%\s+(\d+)"),
        "non_2xx": int(grab(r"^Non-2xx responses:\s+(\d+)") or 0),
        # ab counts a body whose length differs from the first as "failed" (status reads
        # of a job that is running change length); the exceptions are the real failures
        "failed_exceptions": int(grab(r"Exceptions: (\d+)") or 0),
        "api_cpu_ms_per_request": round(cpu * 1000 / n, 3),
    }


def _wait_idle(client: httpx.Client, timeout: float = 600) -> None:
    """Until no job is queued or running (the worker drained the creates)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = client.get("/v1/videos", params={"limit": 100}).json()["data"]
        if not any(v["status"] in ("queued", "in_progress") for v in page):
            return
        time.sleep(1)


def _worker_s(video: dict[str, Any]) -> float:
    stages = video.get("stage_durations") or {}
    return sum(float(stages.get(s) or 0.0) for s in WORKER_STAGES)


def _sync_overheads(client: httpx.Client, jobs: int) -> dict[str, Any]:
    """Sequential sync requests vs create + SSE: wall − worker stages (ms)."""
    client.post("/v1/videos/sync", json=SYNC, timeout=300)  # warm the worker
    sync_ms: list[float] = []
    sse_ms: list[float] = []
    for _ in range(jobs):
        t0 = time.perf_counter()
        resp = client.post("/v1/videos/sync", json=SYNC, timeout=300)
        wall = time.perf_counter() - t0
        resp.raise_for_status()
        video = client.get(f"/v1/videos/{resp.headers['x-request-id']}").json()
        sync_ms.append((wall - _worker_s(video)) * 1000)

        t0 = time.perf_counter()
        vid = client.post("/v1/videos", json=SYNC).json()["id"]
        with client.stream("GET", f"/v1/videos/{vid}/events", timeout=300) as events:
            for line in events.iter_lines():
                if line.startswith("event: done"):
                    break
        wall = time.perf_counter() - t0
        sse_ms.append((wall - _worker_s(client.get(f"/v1/videos/{vid}").json())) * 1000)
    return {
        "request": SYNC,
        "sync_overhead_ms": summary(sync_ms),
        "sse_overhead_ms": summary(sse_ms),
    }


def bench(database: str | None, args: argparse.Namespace, ab: str | None) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="oq-status-bench-"))
    up_args = ["--workers", "1", "--realtime-workers", "0"]
    up_args += ["--api-processes", str(args.api_processes)]
    if database:
        up_args += ["--database-url", database]
    up, url = start_up(data_dir, env={}, args=up_args, log=data_dir / "up.log")
    out: dict[str, Any] = {
        "database": (database or "sqlite").split("://")[0],
        "api_processes": args.api_processes,
    }
    api = _api_processes(up)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            ids = [
                client.post("/v1/videos", json={**TINY, "num_inference_steps": 1}).json()["id"]
                for _ in range(args.jobs)
            ]
            _wait_idle(client)
            body = data_dir / "create.json"
            if ab is not None:
                body.write_text(json.dumps({**TINY, "num_inference_steps": 1}))
                get_url = f"{url}/v1/videos/{ids[len(ids) // 2]}"
                reads = {"n": args.requests, "c": args.concurrency, "api": api}
                _ab(ab, get_url, **{**reads, "n": 300})  # warm-up
                out["get_status"] = _ab(ab, get_url, **reads)
                if args.reads_only:
                    return out
                out["list_20"] = _ab(ab, f"{url}/v1/videos?limit=20", **reads)
            if args.sync_jobs:
                out["sync"] = _sync_overheads(client, args.sync_jobs)
            if ab is not None:  # last: the worker need not drain these
                creates = {"n": args.creates, "c": args.create_concurrency, "api": api}
                out["create"] = _ab(ab, f"{url}/v1/videos", **creates, body=body)
                # The API tier alone, as where workers run on GPU hosts: the worker is
                # frozen (SIGSTOP) so it does not run the jobs on the same cores meanwhile.
                workers = _children(up, "worker")
                for worker in workers:
                    worker.suspend()
                try:
                    out["create_worker_paused"] = _ab(ab, f"{url}/v1/videos", **creates, body=body)
                finally:
                    for worker in workers:
                        worker.resume()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(120)
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


def main() -> None:
    p = parser(__doc__)
    p.add_argument(
        "--database-url",
        action="append",
        default=[],
        help="also run on this (empty) database; repeatable",
    )
    p.add_argument("--no-sqlite", action="store_true", help="only the --database-url runs")
    p.add_argument("--jobs", type=int, default=40, help="jobs created before the reads")
    p.add_argument("--requests", type=int, default=3000, help="ab -n for the reads")
    p.add_argument("--concurrency", type=int, default=50, help="ab -c for the reads")
    p.add_argument("--creates", type=int, default=1000, help="ab -n for the creates")
    p.add_argument("--create-concurrency", type=int, default=20)
    p.add_argument("--sync-jobs", type=int, default=0, help="sync overhead samples (0: skip)")
    p.add_argument("--skip-ab", action="store_true", help="only the sync overhead")
    p.add_argument(
        "--reads-only",
        action="store_true",
        help="only the status reads (A/B of a setting: OMNIQ_METRICS__ENABLED=false ...)",
    )
    p.add_argument(
        "--api-processes", type=int, default=1, help="omniqueue up --api-processes (same port)"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    ab = None if args.skip_ab else _need_ab()
    databases: list[str | None] = [] if args.no_sqlite else [None]
    databases += args.database_url
    result = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": [bench(db, args, ab) for db in databases],
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
