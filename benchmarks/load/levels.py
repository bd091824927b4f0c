"""A load run's phases (``run.py``): the closed-loop saturation measurement, then each
level's open-loop arrivals at a factor of it, followed to the end, and the level's report
(every key in ``report.py``'s docstring) from the clients' records, the watchers'
samples and the stack's end state."""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics
import time
from collections import Counter
from typing import Any

import httpx
import psutil

from benchmarks.embedded_stack import say
from benchmarks.load.clients import Clients, JobRecord
from benchmarks.load.report import job_report
from benchmarks.load.target import Target
from benchmarks.load.watch import Prober, Sampler
from tests.loadgen.stats import percentiles, slope_per_minute
from tests.loadgen.workload import Arrival, Workload, pick, plan_level

PROGRESS_EVERY_S = 10.0
# Closed-loop clients per worker when measuring saturation: each waits up to a poll
# interval (1 s) after its job ends, so a few per worker would leave the worker idle.
SATURATION_CLIENTS_PER_WORKER = 8


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
