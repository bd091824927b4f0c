"""What the load generator (``benchmarks/load/run.py``) watches besides its own clients: the
stack's processes (RSS, restarts), the queue-depth gauge, the GPU worker's memory log
lines, a low-rate prober of status reads and ``/health``, and, at the end of each level,
what should be left over: temp dirs, Redis keys without a TTL, S3 orphans and open
multipart uploads, the jobs table by status.

Each watcher is a daemon thread with its own synchronous client, so a busy event loop
in the generator does not delay its samples.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.embedded_stack import _MEMORY_RE

_DEPTH_RE = re.compile(r"^omniqueue_queue_depth\{[^}]*\}\s+([0-9.eE+-]+)\s*$", re.M)
_LOG_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
_JOB_KEY_RE = re.compile(r"^(video|audio)s/([^/]+)/(.+)$")


def process_name(proc: psutil.Process) -> str | None:
    """A stable name for one process of the stack, from its command line: ``api``
    (``api 2`` for the third on its port), the worker's ``--name`` (``embedded-0``,
    ``embedded-rt``), ``webhooks``, ``weed``, ``valkey``; None for anything else."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return None
    joined = " ".join(argv)
    if "valkey-server" in joined:
        return "valkey"
    if "weed" in joined:
        return "weed"
    if "cli.main" not in argv:
        return None
    rest = argv[argv.index("cli.main") + 1 :]
    sub = rest[0] if rest else ""
    if sub == "worker":
        return rest[rest.index("--name") + 1] if "--name" in rest[:-1] else "worker"
    if sub == "api":
        port = rest[rest.index("--port") + 1] if "--port" in rest[:-1] else ""
        return f"api:{port}" if port else "api"
    if sub == "webhooks":
        return "webhooks"
    return sub or None


class StackProcesses:
    """The processes to watch: the children of ``up_pid`` (re-read at every sample, so
    a restarted child is picked up), or a fixed list of ``pids``."""

    def __init__(self, up_pid: int | None = None, pids: list[int] | None = None) -> None:
        self.up_pid = up_pid
        self.pids = pids or []

    def current(self) -> dict[str, list[psutil.Process]]:
        """name → processes (API processes sharing a port share a name)."""
        procs: list[psutil.Process] = []
        if self.up_pid is not None:
            with contextlib.suppress(psutil.Error):
                procs = psutil.Process(self.up_pid).children()
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        out: dict[str, list[psutil.Process]] = defaultdict(list)
        for proc in procs:
            name = process_name(proc) or f"pid{proc.pid}"
            out[name].append(proc)
        return out


def _rss_mb(proc: psutil.Process) -> float:
    """RSS of a process and its descendants, MiB."""
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total / 2**20


@dataclass
class Sample:
    t: float  # seconds since the run's start
    level: str
    rss_mb: dict[str, float]
    queue_depth: float | None
    in_flight: int


class _Watcher:
    """A daemon thread running ``_loop`` from :meth:`start` until :meth:`stop`."""

    _name = "load-watcher"
    _stop: threading.Event
    _thread: threading.Thread | None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        raise NotImplementedError


@dataclass
class Sampler(_Watcher):
    """Every ``interval_s``: RSS per process (API processes of one port one entry each:
    ``api:PORT#i``), the queue-depth gauge of ``/metrics``, the generator's in-flight
    count; and, as they come, the GPU worker's ``cuda memory allocated`` log lines."""

    processes: StackProcesses
    base_url: str
    level: Callable[[], str]
    in_flight: Callable[[], int]
    t0: float
    interval_s: float = 2.0
    worker_log: Path | None = None
    samples: list[Sample] = field(default_factory=list)
    gpu_mib: list[tuple[float, str, float]] = field(default_factory=list)  # (t, level, MiB)
    new_pids: list[tuple[float, str, str, int]] = field(default_factory=list)
    _seen: dict[str, set[int]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _log_offset: int = 0
    _thread: threading.Thread | None = None

    _name = "load-sampler"

    def _loop(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=5, trust_env=False) as client:
            while not self._stop.is_set():
                with contextlib.suppress(Exception):  # a sample lost is not a run lost
                    self.sample(client)
                self._stop.wait(self.interval_s)

    def sample(self, client: httpx.Client) -> None:
        t = time.monotonic() - self.t0
        level = self.level()
        rss: dict[str, float] = {}
        for name, procs in sorted(self.processes.current().items()):
            seen = self._seen.setdefault(name, set())
            for i, proc in enumerate(sorted(procs, key=lambda p: p.pid)):
                with contextlib.suppress(psutil.Error):
                    key = name if len(procs) == 1 else f"{name}#{i}"
                    rss[key] = round(_rss_mb(proc), 1)
                if proc.pid not in seen:
                    if self.samples:  # a process that appeared after the first sample
                        self.new_pids.append((t, level, name, proc.pid))
                    seen.add(proc.pid)
        depth = None
        with contextlib.suppress(httpx.HTTPError):
            resp = client.get("/metrics")
            if resp.status_code == 200:
                values = [float(v) for v in _DEPTH_RE.findall(resp.text)]
                depth = sum(values) if values else None
        self.samples.append(Sample(round(t, 2), level, rss, depth, self.in_flight()))
        self._read_log(t, level)

    def _read_log(self, t: float, level: str) -> None:
        if self.worker_log is None or not self.worker_log.exists():
            return
        with open(self.worker_log, "rb") as f:
            f.seek(self._log_offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._log_offset += end
        for raw in data[:end].split(b"\n"):
            line = raw.decode(errors="replace")
            if m := _MEMORY_RE.search(line):
                at = t
                if stamp := _LOG_TIME_RE.match(line):
                    wall = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
                    at = wall + int(stamp.group(2)) / 1000 - (time.time() - time.monotonic())
                    at -= self.t0
                self.gpu_mib.append((round(at, 2), level, float(m.group(2))))


@dataclass
class Prober(_Watcher):
    """``rate`` GETs a second of one path (a callable: a recent job's status, or
    ``/health``), on its own thread and connection. Records ``(t, level, ms, status)``;
    a tick that starts more than 50 ms late (the generator itself was busy) is counted."""

    base_url: str
    path: Callable[[], str | None]
    level: Callable[[], str]
    t0: float
    rate: float = 20.0
    reads: list[tuple[float, str, float, int]] = field(default_factory=list)
    late_ticks: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    _name = "load-prober"

    def _loop(self) -> None:
        gap = 1.0 / self.rate
        with httpx.Client(base_url=self.base_url, timeout=10, trust_env=False) as client:
            tick = time.monotonic()
            while not self._stop.is_set():
                tick += gap
                delay = tick - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                elif delay < -0.05:
                    self.late_ticks += 1
                    tick = time.monotonic()
                path = self.path()
                if path is None:
                    continue
                t = time.monotonic()
                try:
                    status = client.get(path).status_code
                except httpx.HTTPError:
                    status = 0
                ms = (time.monotonic() - t) * 1000
                self.reads.append((round(t - self.t0, 3), self.level(), ms, status))


# -- end-of-level checks -----------------------------------------------------------------


def temp_dirs(tmp_dir: Path | None) -> int | None:
    """``omniq-*`` directories left in the worker's temp dir; None when unknown."""
    if tmp_dir is None:
        return None
    return sum(1 for _ in tmp_dir.glob("omniq-*"))


def redis_keys_without_ttl(url: str | None) -> dict[str, Any] | None:
    """``oq:*`` keys of the stack's Redis with no TTL (count and a few names)."""
    if url is None:
        return None
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = [k.decode() for k in client.scan_iter(match="oq:*", count=1000)]
        no_ttl = [k for k in keys if client.ttl(k) == -1]
    finally:
        client.close()
    return {"oq_keys": len(keys), "without_ttl": len(no_ttl), "examples": sorted(no_ttl)[:10]}


def jobs_by_status(engine: Any) -> dict[str, int]:
    """The jobs table: ``completed``, ``queued``, ``failed:<code>``, … → count."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, error_code, count(*) FROM jobs GROUP BY status, error_code")
        ).all()
    out: dict[str, int] = {}
    for status, code, count in rows:
        key = f"{status}:{code}" if status == "failed" else str(status)
        out[key] = out.get(key, 0) + int(count)
    return dict(sorted(out.items()))


def s3_leftovers(s3: Any, bucket: str, engine: Any) -> dict[str, Any]:
    """Open multipart uploads, and orphan objects: every key under ``videos/<id>/`` or
    ``audios/<id>/`` of a job that failed or is gone, and, of a completed job, any key
    that is neither one of its artifacts (the ``artifacts`` table) nor its ``input/``."""
    from sqlalchemy import bindparam, text

    uploads = 0
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        uploads += len(page.get("Uploads", []) or [])
    by_job: dict[str, list[str]] = defaultdict(list)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []) or []:
            if m := _JOB_KEY_RE.match(obj["Key"]):
                by_job[m.group(2)].append(obj["Key"])
    status: dict[str, str] = {}
    artifacts: set[str] = set()
    ids = sorted(by_job)
    in_ids: Any = bindparam("ids", expanding=True)
    jobs_query = text("SELECT id, status FROM jobs WHERE id IN :ids").bindparams(in_ids)
    keys_query = text("SELECT key FROM artifacts WHERE job_id IN :ids").bindparams(in_ids)
    with engine.connect() as conn:
        for start in range(0, len(ids), 500):
            chunk = {"ids": ids[start : start + 500]}
            status.update(dict(conn.execute(jobs_query, chunk).all()))
            artifacts.update(k for (k,) in conn.execute(keys_query, chunk).all())
    orphans: list[str] = []
    for job_id, job_keys in by_job.items():
        state = status.get(job_id, "gone")
        if state in ("queued", "in_progress"):
            continue
        for key in job_keys:
            kept = state == "completed" and (key in artifacts or "/input/" in key)
            if not kept:
                orphans.append(f"{key} ({state})")
    return {
        "open_multipart_uploads": uploads,
        "orphan_objects": len(orphans),
        "orphan_examples": sorted(orphans)[:10],
    }
