"""Open-loop load: a declared mix of clients arriving at 50 %, 90 % and 120 % of the
stack's measured saturation throughput, and what the stack did under it (one JSON
object on stdout, progress on stderr, optionally a PNG).

    python benchmarks/load.py --levels 0.5,0.9,1.2 --duration 60 --png load.png
    python benchmarks/load.py --saturation-rps 2 --levels 0.5 --duration 10   # quick
    python benchmarks/load.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/load \\
        --api-processes 2 --workers 2 --levels 0.5 --duration 1800    # the issue's soak
    python benchmarks/load.py --base-url http://127.0.0.1:8000 --up-pid 1234 \\
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
workload file (``--workload``, default ``benchmarks/workloads/cpu_mixed.toml``; format
in ``benchmarks/load_workload.py``): poll, sse, sync, cancel, sync_disconnect, audio,
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
``benchmarks/load_report.py``'s docstring.

**Percentiles** are only reported with at least 10 samples beyond them: n ≥ 10/(1−q), so
p50 ≥ 20, p95 ≥ 200, p99 ≥ 1000 samples; otherwise null next to its n
(``benchmarks/load_stats.py``). At 20 probes/s a 60 s level has ~1200 status reads.

``--keep-log PATH`` keeps the embedded stack's stderr (its children's logs) after the
run; the data directory is removed.

**PNG** (``--png``, matplotlib): end-to-end and probe latency, queue depth and
in-flight, RSS per process, over the run's time with the levels marked.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import resource
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, emit, machine, parser
from benchmarks.embedded_stack import git_state, say
from benchmarks.load_clients import Clients, JobRecord
from benchmarks.load_report import job_report
from benchmarks.load_stats import TAIL_SAMPLES, percentiles, slope_per_minute
from benchmarks.load_target import Target
from benchmarks.load_watch import Prober, Sampler
from benchmarks.load_workload import (
    Arrival,
    Profile,
    Workload,
    load_workload,
    pick,
    plan_level,
)

DEFAULT_WORKLOAD = ROOT / "benchmarks" / "workloads" / "cpu_mixed.toml"
PROGRESS_EVERY_S = 10.0
# Closed-loop clients per worker when measuring saturation: each waits up to a poll
# interval (1 s) after its job ends, so a few per worker would leave the worker idle.
SATURATION_CLIENTS_PER_WORKER = 8


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


async def probe_features(client: httpx.AsyncClient, workload: Workload) -> dict[str, Any]:
    """Whether the server takes ``ttl`` on a create and answers ``estimated_start_at``:
    one tiny job with a ttl, cancelled at once."""
    body = {"prompt": "load: feature probe", **workload.shapes[0].body(), "ttl": 3600}
    resp = await client.post("/v1/videos", json=body)
    ttl = True
    if resp.status_code == 400 and (resp.json().get("error") or {}).get("param") == "ttl":
        ttl = False
        body.pop("ttl")
        resp = await client.post("/v1/videos", json=body)
    if resp.status_code != 200:
        raise SystemExit(f"a create failed: {resp.status_code} {resp.text[:300]}")
    video = resp.json()
    await client.post(f"/v1/videos/{video['id']}/cancel")
    return {
        "ttl": ttl,
        "estimated_start_at": "estimated_start_at" in video,
        "probe_job": video["id"],
    }


class Run:
    """The state of one run: clients, watchers, every level's records."""

    def __init__(self, args: argparse.Namespace, workload: Workload, target: Target) -> None:
        self.args = args
        self.workload = workload
        self.target = target
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.level = "start"
        self.recent_ids: collections.deque[str] = collections.deque(maxlen=50)
        self.loop_lag_ms: list[tuple[float, float]] = []
        self.clients: Clients | None = None
        self.levels: list[dict[str, Any]] = []
        self.windows: list[tuple[str, float, float]] = []
        self.records: list[tuple[str, JobRecord]] = []
        self.sampler = Sampler(
            target.processes,
            target.url,
            level=lambda: self.level,
            in_flight=lambda: self.clients.in_flight if self.clients else 0,
            t0=self.t0,
            interval_s=args.sample_interval,
            worker_log=target.worker_log,
        )
        self.status_prober = Prober(
            target.url, self.status_path, lambda: self.level, self.t0, args.probe_rate
        )
        self.health_prober = Prober(
            target.url, lambda: "/health", lambda: self.level, self.t0, args.probe_rate
        )
        self.watchers = (self.sampler, self.status_prober, self.health_prober)

    def t(self) -> float:
        return time.monotonic() - self.t0

    def status_path(self) -> str | None:
        return f"/v1/videos/{self.recent_ids[-1]}" if self.recent_ids else None

    async def _lag_monitor(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.05)
            self.loop_lag_ms.append((self.t(), (time.monotonic() - t - 0.05) * 1000))

    async def saturation(self) -> dict[str, Any]:
        """Closed loop: the workload's shapes (and audio share), create + poll."""
        assert self.clients is not None
        a = self.args
        n = a.saturation_clients or SATURATION_CLIENTS_PER_WORKER * (a.workers or 1) + 2
        weights = {
            "poll": sum(w for k, w in self.workload.behaviours.items() if k != "audio"),
            "audio": self.workload.behaviours["audio"],
        }
        shape_weights = {str(i): s.weight for i, s in enumerate(self.workload.shapes)}
        start = time.monotonic()
        stop_at = start + a.saturation_duration
        counted_from = start + a.saturation_warmup
        done: list[JobRecord] = []
        self.level = "saturation"
        say(f"saturation: {n} closed-loop clients for {a.saturation_duration:.0f} s")

        async def client_loop() -> None:
            assert self.clients is not None
            while time.monotonic() < stop_at:
                shape = self.workload.shapes[int(pick(shape_weights, self.rng))]
                arrival = Arrival(0.0, pick(weights, self.rng), shape, None)
                rec = await self.clients.run(arrival)
                if rec.job_id and rec.kind == "video":
                    self.recent_ids.append(rec.job_id)
                done.append(rec)
                if rec.job_id is None:
                    await asyncio.sleep(0.5)  # refused: do not spin

        loops = [asyncio.create_task(client_loop()) for _ in range(n)]
        try:
            await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
            await self._follow(loops, stop_at)
        finally:
            await _cancel(loops)
        window = a.saturation_duration - a.saturation_warmup
        counted = [
            r
            for r in done
            if r.outcome == "completed" and r.end_mono and counted_from <= r.end_mono <= stop_at
        ]
        rps = len(counted) / window if window > 0 else 0.0
        self.windows.append(("saturation", start - self.t0, stop_at - self.t0))
        depths = [
            s.queue_depth
            for s in self.sampler.samples
            if s.queue_depth is not None and counted_from - self.t0 <= s.t <= stop_at - self.t0
        ]
        say(f"saturation: {rps:.3f} jobs/s ({len(counted)} completed in {window:.0f} s)")
        return {
            "measured": True,
            "rps": round(rps, 4),
            "clients": n,
            "completed": len(counted),
            "window_s": window,
            "e2e_s": percentiles([r.e2e_s for r in counted if r.e2e_s is not None], 3),
            "refused": sum(1 for r in done if r.job_id is None),
            # > 0 throughout means the workers never waited for a job: a true saturation
            "queue_depth_min": min(depths) if depths else None,
            "queue_depth_mean": round(statistics.fmean(depths), 1) if depths else None,
        }

    async def level_run(self, factor: float, rate: float) -> None:
        assert self.clients is not None
        a = self.args
        name = f"{round(factor * 100)}%"
        self.level = name
        arrivals = plan_level(self.workload, rate, a.duration, self.rng, a.profile_obj)
        say(f"level {name}: {rate:.3f} jobs/s for {a.duration:.0f} s ({len(arrivals)} arrivals)")
        proc = psutil.Process()
        cpu0 = sum(proc.cpu_times()[:2])
        start = time.monotonic()
        tasks: list[asyncio.Task[JobRecord]] = []

        async def progress() -> None:
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                finished = [t.result() for t in tasks if t.done() and not t.exception()]
                errors = sum(1 for r in finished if r.job_id is None or r.outcome == "failed")
                assert self.clients is not None
                say(
                    f"[{name}] {time.monotonic() - start:5.0f} s  offered {len(tasks)}"
                    f"  done {len(finished)}  in flight {self.clients.in_flight}"
                    f"  refused/failed {errors}"
                )

        reporter = asyncio.create_task(progress())
        try:
            for arrival in arrivals:
                delay = start + arrival.at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._tracked(arrival)))
            await asyncio.sleep(max(0.0, start + a.duration - time.monotonic()))
            end = time.monotonic()
            say(f"[{name}] arrivals over; following {self.clients.in_flight} clients to the end")
            await self._follow(tasks, end)
            records = [t.result() for t in tasks]
        finally:
            reporter.cancel()
            await _cancel(tasks)  # interrupted: no client may outlive the HTTP client
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        settled = time.monotonic()
        say(f"[{name}] all clients done after {settled - end:.0f} s; settling {a.settle:.0f} s")
        await asyncio.sleep(a.settle)
        self.windows.append((name, start - self.t0, end - self.t0))
        self.records += [(name, r) for r in records]
        report = await asyncio.to_thread(
            self._level_report, name, factor, rate, len(arrivals), records, start, end
        )
        report["generator"]["cpu_percent"] = round(100 * cpu / max(settled - start, 1e-9), 1)
        self.levels.append(report)

    async def _follow(self, tasks: list[asyncio.Task[Any]], since: float) -> None:
        """Wait for ``tasks`` (clients following their jobs) until all are done, or
        until no job ended for ``--settle-timeout`` s or ``--settle-max`` s passed since
        ``since``: the clients then give up and their jobs count as lost."""
        assert self.clients is not None
        a = self.args
        while any(not t.done() for t in tasks):
            await asyncio.wait([t for t in tasks if not t.done()], timeout=1.0)
            now = time.monotonic()
            stalled = now - max(self.clients.last_end, since) > a.settle_timeout
            if stalled or now - since > a.settle_max:
                why = "no job ended lately" if stalled else "--settle-max passed"
                say(f"giving up on {self.clients.in_flight} clients ({why})")
                self.clients.give_up.set()
                await asyncio.wait(tasks)
                self.clients.give_up.clear()
                return

    async def _tracked(self, arrival: Arrival) -> JobRecord:
        assert self.clients is not None
        rec = await self.clients.run(arrival)
        if rec.job_id and rec.kind == "video":
            self.recent_ids.append(rec.job_id)
        return rec

    def _level_report(
        self,
        name: str,
        factor: float,
        rate: float,
        arrivals: int,
        records: list[JobRecord],
        start: float,
        end: float,
    ) -> dict[str, Any]:
        a = self.args
        t_start, t_end = start - self.t0, end - self.t0
        duration = end - start
        jobs = job_report(records, start, end)
        db = self.target.db_status([r.job_id for r in records if r.job_id])
        mismatches = (
            None
            if db is None
            else sum(1 for r in records if r.job_id and r.outcome and db.get(r.job_id) != r.outcome)
        )
        probes = {"status": self.status_prober.reads, "health": self.health_prober.reads}
        probe_ms = {
            key: [
                ms
                for t, lvl, ms, st in reads
                if lvl == name and t_start <= t <= t_end and st == 200
            ]
            for key, reads in probes.items()
        }
        probe_errors = {
            key: sum(1 for t, lvl, _, st in reads if lvl == name and st != 200)
            for key, reads in probes.items()
        }
        samples = [s for s in self.sampler.samples if s.level == name and t_start <= s.t <= t_end]
        rss_names = sorted({k for s in samples for k in s.rss_mb})
        rss_slope = {
            k: slope_per_minute(
                [(s.t, s.rss_mb[k]) for s in samples if k in s.rss_mb], a.slope_warmup
            )
            for k in rss_names
        }
        gpu = [(t, mib) for t, lvl, mib in self.sampler.gpu_mib if lvl == name]
        depths = [s.queue_depth for s in samples if s.queue_depth is not None]
        restarts = Counter(n for _, lvl, n, _ in self.sampler.new_pids if lvl == name)
        status_p = percentiles(probe_ms["status"])
        health_p = percentiles(probe_ms["health"])
        create_p = jobs["create_ms"]
        lags = [ms for t, ms in self.loop_lag_ms if t_start <= t <= t_end]
        report: dict[str, Any] = {
            "level": factor,
            "name": name,
            "duration_s": round(duration, 1),
            "offered_rps_target": round(rate, 4),
            "arrivals": arrivals,
            "offered_rps": round(arrivals / duration, 4),
            **jobs,
            "terminal_mismatches": mismatches,
            "status_read_ms": status_p,
            "health_ms": health_p,
            "poll_read_ms": percentiles(self._take_poll_reads()),
            "probe_errors": probe_errors,
            "rss_slope_mb_per_min": rss_slope,
            "rss_end_mb": samples[-1].rss_mb if samples else None,
            "gpu_memory_slope_mib_per_min": slope_per_minute(gpu, a.slope_warmup) if gpu else None,
            "queue_depth": {
                "max": max(depths) if depths else None,
                "mean": round(statistics.fmean(depths), 1) if depths else None,
            },
            "in_flight_max": max((s.in_flight for s in samples), default=None),
            "end_state": self.target.end_state(dict(restarts)),
            "generator": {
                "loop_lag_ms": percentiles(lags),
                "probe_late_ticks": self.status_prober.late_ticks + self.health_prober.late_ticks,
            },
        }
        report["checks"] = {
            "status_read_p99_le_50ms": None if status_p["p99"] is None else status_p["p99"] <= 50,
            "health_p99_le_50ms": None if health_p["p99"] is None else health_p["p99"] <= 50,
            "create_max_le_1s": None if create_p["max"] is None else create_p["max"] <= 1000,
            "no_lost_jobs": not jobs["lost_jobs"],
        }
        return report

    def _take_poll_reads(self) -> list[float]:
        """The clients' own status reads since the last call (they are not timestamped:
        a level takes those made since the previous level's report)."""
        assert self.clients is not None
        reads, self.clients.poll_read_ms = self.clients.poll_read_ms, []
        return reads

    def series(self) -> dict[str, Any]:
        def mono_t(x: float | None) -> float | None:
            return None if x is None else x - self.t0

        return {
            "levels": self.windows,
            "e2e": [
                (mono_t(r.end_mono), r.e2e_s)
                for _, r in self.records
                if r.outcome == "completed" and r.e2e_s is not None
            ],
            "status_reads": [(t, ms) for t, _, ms, st in self.status_prober.reads if st == 200],
            "health": [(t, ms) for t, _, ms, st in self.health_prober.reads if st == 200],
            "queue": [(s.t, s.queue_depth, s.in_flight) for s in self.sampler.samples],
            "rss": {
                k: [(s.t, s.rss_mb[k]) for s in self.sampler.samples if k in s.rss_mb]
                for k in sorted({k for s in self.sampler.samples for k in s.rss_mb})
            },
        }

    async def main(self, out: dict[str, Any]) -> None:
        a = self.args
        headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else None
        limits = httpx.Limits(
            max_connections=a.max_connections, max_keepalive_connections=a.max_connections
        )
        timeout = httpx.Timeout(30.0, pool=None)
        lag = asyncio.create_task(self._lag_monitor())
        async with httpx.AsyncClient(
            base_url=self.target.url,
            headers=headers,
            limits=limits,
            timeout=timeout,
            trust_env=False,
        ) as client:
            features = await probe_features(client, self.workload)
            self.recent_ids.append(features["probe_job"])
            out["server_features"] = features
            self.clients = Clients(client, self.workload, self.rng, ttl_supported=features["ttl"])
            if a.saturation_rps is None:
                out["saturation"] = await self.saturation()
                await asyncio.sleep(a.settle)
                self.clients.poll_read_ms = []
            else:
                out["saturation"] = {"measured": False, "rps": a.saturation_rps}
            rate = out["saturation"]["rps"]
            if rate <= 0:
                raise SystemExit("saturation throughput is 0: nothing completed")
            for factor in a.level_factors:
                await self.level_run(factor, factor * rate)
        lag.cancel()


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel the tasks still running and wait for them."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


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
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_state(),
        "machine": machine(),
        "stack": target.describe(),
        "workload": {"path": str(args.workload), **workload.describe()},
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
                from benchmarks.load_plot import plot

                try:
                    plot(args.png, run.series(), f"omniqueue load: {workload.name}")
                    out["png"] = str(args.png)
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
