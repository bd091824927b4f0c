"""What the API's HTTP metrics cost per request: the ``HttpMetrics`` middleware around a
do-nothing ASGI app, against the bare app, in one process (``--requests`` calls each,
best of ``--rounds``), with metrics in memory and, in a child process, in multiprocess
files (``PROMETHEUS_MULTIPROC_DIR``, as API processes sharing a port keep them).

    python -m benchmarks.api_tier.metrics_overhead
    python -m benchmarks.api_tier.metrics_overhead --out docs/evidence/metrics_overhead.json

The whole request's CPU with and without metrics (``OMNIQ_METRICS__ENABLED=false``) is
``benchmarks/api_tier/status_reads.py``'s ``api_cpu_ms_per_request`` (docs/PERFORMANCE.md).
Prints JSON (µs per request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, command_line, emit, machine, parser


class _Route:
    path = "/v1/videos/{video_id}"


_ROUTE = _Route()
_START = {"type": "http.response.start", "status": 200, "headers": []}
_BODY = {"type": "http.response.body", "body": b"{}"}


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    scope["route"] = _ROUTE  # what Starlette's router sets
    await send(_START)
    await send(_BODY)


async def _send(message: dict[str, Any]) -> None:
    return None


async def _loop(app: Any, n: int) -> float:
    scope = {"type": "http", "method": "GET", "path": "/v1/videos/x"}
    start = time.perf_counter()
    for _ in range(n):
        await app(scope, None, _send)
    return (time.perf_counter() - start) / n * 1e6


def _measure(n: int, rounds: int) -> dict[str, float]:
    from api.metrics import HttpMetrics

    wrapped = HttpMetrics(_app)
    bare = min(asyncio.run(_loop(_app, n)) for _ in range(rounds))
    metered = min(asyncio.run(_loop(wrapped, n)) for _ in range(rounds))
    return {
        "bare_us": round(bare, 3),
        "with_metrics_us": round(metered, 3),
        "overhead_us": round(metered - bare, 3),
    }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    if args.child:  # one measurement in this process's mode, as JSON
        print(json.dumps(_measure(args.requests, args.rounds)))
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="oq-metrics-") as directory:
        for mode, extra in (
            ("in_memory", {}),
            ("multiprocess", {"PROMETHEUS_MULTIPROC_DIR": directory}),
        ):
            env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
            cmd = [sys.executable, "-m", "benchmarks.api_tier.metrics_overhead", "--child"]
            cmd += ["--requests", str(args.requests)]
            out = subprocess.run(
                [*cmd, "--rounds", str(args.rounds)],
                env={**env, **extra},
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            results[mode] = json.loads(out.strip().splitlines()[-1])
    report = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "requests": args.requests,
        "results": results,
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
