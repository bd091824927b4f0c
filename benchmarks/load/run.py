"""Open-loop load: a declared mix of clients arriving at 50 %, 90 % and 120 % of the
stack's measured saturation throughput, and what the stack did under it (one JSON
object on stdout, progress on stderr, optionally a PNG).

    python -m benchmarks.load.run --levels 0.5,0.9,1.2 --duration 60 --png load.png
    python -m benchmarks.load.run --saturation-rps 2 --levels 0.5 --duration 10   # quick
    python -m benchmarks.load.run \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/load \\
        --api-processes 2 --workers 2 --levels 0.5 --duration 1800    # the issue's soak
    python -m benchmarks.load.run --base-url http://127.0.0.1:8000 --up-pid 1234 \\
        --worker-log up.log --saturation-rps 0.2                        # a running stack

**Stack.** By default an embedded ``omniqueue up`` (``--workers`` CPU reference workers,
no realtime worker, ``--api-processes``, SQLite unless ``--database-url``; every
``--env KEY=VAL`` reaches up and its children, e.g. ``--env OMNIQ_QUEUE__MAX_DEPTH=50``),
stopped with SIGINT at the end, also after Ctrl-C, SIGINT or SIGTERM (the JSON of
the levels done so far is still printed, with ``interrupted: true``). ``--redis-url``
makes ``up`` use that Redis instead of its embedded Valkey (flush the database first:
the run's checks count its keys). With ``--base-url`` the stack is one already
running: its processes are the children of ``--up-pid`` or the ``--pids``; the
end-of-level checks use ``--database-url``, ``--redis-url``, ``--worker-tmp-dir`` and
S3 from the ``OMNIQ_S3__*`` environment when given (each check is null otherwise), and
``--api-key`` is sent as a bearer key.

**Arrivals** (``--profile``): ``poisson`` (default; exponential gaps at the level's rate,
from ``--seed``), ``step`` (Poisson at the rate times ``--step-factors`` (0.5,1.5), each
for ``--step-period`` s, cycling), ``burst`` (``--burst-size`` arrivals at once every
``burst-size / rate`` s). Every arrival draws a behaviour and a video shape from the
workload file (``--workload``, default ``benchmarks/load/workloads/cpu_mixed.toml``; format
in ``tests/loadgen/workload.py``): poll, sse, sync, cancel, sync_disconnect, audio,
idempotent_retry, and a ``ttl`` on a share of creates. A 429 is a refusal (the client
does not retry), not a stack error. Every create carries the behaviour's body; a /sync
call carries an ``Idempotency-Key``, so a hung-up one's job is found again by replaying
the key on ``POST /v1/videos``; if the hang-up came before the server stored the job,
that replay creates it and it runs (a ``completed`` under ``sync_disconnect``). All
clients share one ``httpx.AsyncClient`` (``--max-connections``, 800) on one event loop.

**Saturation.** Unless ``--saturation-rps`` is given: ``--saturation-clients`` (default
8 × workers + 2) closed-loop clients create-and-poll the workload's shapes (and its audio
share) for ``--saturation-duration`` s; saturation = jobs completed after
``--saturation-warmup`` s per second. Its ``queue_depth_min`` > 0 says the workers
never waited for work. The open-loop mix (SSE, /sync, cancels, the prober) costs the
stack more than this create-and-poll loop, so on one machine the mix saturates below
it: read ``achieved_rps`` against ``offered_rps``. Then each ``--levels`` factor runs for
``--duration`` s at factor × saturation. After a level's arrivals stop, its clients
follow their jobs until every one is terminal, or until no job has ended for
``--settle-timeout`` s (default 120) or ``--settle-max`` s (1800) have passed: the jobs
still not terminal then are lost. Then ``--settle`` s pass (the reconciler and temp
sweep run every 10 s) before the leftover checks, so the next level starts on an empty
queue. Pollers wait what ``openai-poll-after-ms`` says (1 s by default) between reads,
as the OpenAI SDK does.

**Watchers.** A prober thread GETs ``/v1/videos/{a recent id}`` and another ``/health``,
``--probe-rate`` times a second each; a sampler thread takes, every
``--sample-interval`` s, each stack process's RSS (with its children), the
``omniqueue_queue_depth`` gauge of ``/metrics`` and the generator's requests in flight,
and reads the worker log (the embedded stack's stderr, or ``--worker-log``) for
``job <id>: cuda memory allocated <MiB> MiB``.

**Report** (stdout; ``--out`` also writes it): every key is described in
``benchmarks/load/report.py``'s docstring.

**Percentiles** are only reported with at least 10 samples beyond them: n ≥ 10/(1−q), so
p50 ≥ 20, p95 ≥ 200, p99 ≥ 1000 samples; otherwise null next to its n
(``tests/loadgen/stats.py``). At 20 probes/s a 60 s level has ~1200 status reads.

``--keep-log PATH`` keeps the embedded stack's stderr (its children's logs) after the
run; the data directory is removed.

**PNG** (``--png``, matplotlib): end-to-end and probe latency, queue depth and
in-flight, RSS per process, over the run's time with the levels marked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import command_line, emit, machine, parser, repo_path
from benchmarks.embedded_stack import git_state, say
from benchmarks.load.levels import Run
from benchmarks.load.target import Target
from tests.loadgen.stats import TAIL_SAMPLES
from tests.loadgen.workload import Profile, load_workload

DEFAULT_WORKLOAD = Path(__file__).with_name("workloads") / "cpu_mixed.toml"


def _args() -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    p.add_argument("--levels", default="0.5,0.9,1.2", help="factors of the saturation rate")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per level")
    p.add_argument("--saturation-rps", type=float, default=None, help="skip the measurement")
    p.add_argument("--saturation-duration", type=float, default=40.0)
    p.add_argument("--saturation-warmup", type=float, default=10.0)
    p.add_argument("--saturation-clients", type=int, default=None)
    p.add_argument("--profile", choices=("poisson", "step", "burst"), default="poisson")
    p.add_argument("--step-factors", default="0.5,1.5")
    p.add_argument("--step-period", type=float, default=10.0)
    p.add_argument("--burst-size", type=int, default=10)
    p.add_argument("--seed", type=int, default=20261202)
    p.add_argument(
        "--settle-timeout",
        type=float,
        default=120.0,
        help="s without a job ending: the rest are lost",
    )
    p.add_argument("--settle-max", type=float, default=1800.0, help="s after arrivals, at most")
    p.add_argument("--settle", type=float, default=12.0)
    p.add_argument("--probe-rate", type=float, default=20.0, help="per second, each probe")
    p.add_argument("--sample-interval", type=float, default=2.0)
    p.add_argument("--slope-warmup", type=float, default=0.25, help="fraction of a level")
    p.add_argument("--max-connections", type=int, default=800)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--api-processes", type=int, default=1)
    p.add_argument("--database-url", default=None)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL")
    p.add_argument("--base-url", default=None, help="a running stack instead of up")
    p.add_argument("--up-pid", type=int, default=None)
    p.add_argument("--pids", default="", help="comma-separated pids to watch")
    p.add_argument("--worker-log", type=Path, default=None)
    p.add_argument("--worker-tmp-dir", type=Path, default=None)
    p.add_argument("--redis-url", default=None, help="an existing Redis for up (or the key check)")
    p.add_argument("--api-key", default=os.environ.get("OMNIQ_API_KEY"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--keep-log", default=None, help="copy up's stderr here")
    args = p.parse_args()
    args.level_factors = [float(x) for x in args.levels.split(",") if x.strip()]
    args.profile_obj = Profile(
        kind=args.profile,
        factors=tuple(float(x) for x in args.step_factors.split(",")),
        period_s=args.step_period,
        burst_size=args.burst_size,
    )
    for item in args.env:
        if "=" not in item:
            p.error(f"--env {item!r}: KEY=VAL")
    return args


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


def _stoppable() -> None:
    """Ctrl-C, SIGINT and SIGTERM all end the run through KeyboardInterrupt (the stack is
    then stopped), also when started in the background, where SIGINT comes ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))


def main() -> int:
    args = _args()
    _stoppable()
    workload = load_workload(args.workload)
    _raise_fd_limit()
    started = time.time()
    target = Target(args)
    out: dict[str, Any] = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_state(),
        "machine": machine(),
        "stack": target.describe(),
        "workload": {"path": repo_path(args.workload), **workload.describe()},
        "profile": args.profile_obj.__dict__,
        "percentile_rule": f"pXX only when n >= {TAIL_SAMPLES}/(1-q): p50>=20, p95>=200, "
        "p99>=1000; null otherwise",
        "interrupted": False,
    }
    me = psutil.Process()
    run: Run | None = None
    try:
        target.start()
        out["stack"]["url"] = target.url
        run = Run(args, workload, target)
        for watcher in run.watchers:
            watcher.start()
        asyncio.run(run.main(out))
    except KeyboardInterrupt:
        say("interrupted: stopping the stack")
        out["interrupted"] = True
    finally:
        if run is not None:
            for watcher in run.watchers:
                watcher.stop()
            out["levels"] = run.levels
            if args.png is not None and run.windows:
                from benchmarks.load.plot import plot

                try:
                    plot(args.png, run.series(), f"omniqueue load: {workload.name}")
                    out["png"] = repo_path(args.png)
                except Exception as exc:  # the figure is a bonus; the JSON is the result
                    out["png_error"] = f"{type(exc).__name__}: {exc}"
        out["generator_cpu_s"] = round(sum(me.cpu_times()[:2]), 1)
        target.stop(out)
        out["total_wall_s"] = round(time.time() - started, 1)
        emit(out, args.out)
    bad = out.get("interrupted") or out.get("up_exit_code") not in (0, None)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
