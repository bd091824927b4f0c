"""``omniqueue up``: the whole stack on one machine, all state under one data directory.

Valkey and SeaweedFS run embedded (:mod:`cli.embedded`), the database is a SQLite file,
and the API, the workers and the webhook sender are ``omniqueue api`` / ``omniqueue
worker`` / ``omniqueue webhooks serve`` child processes configured through ``OMNIQ_``
environment variables (on loopback, webhooks may go to private and loopback hosts).
Once up, every one of them is supervised (:mod:`workers.runtime.supervisor`): one that dies is
restarted after a backoff, so a killed worker's job is taken over and the API stays up;
one that keeps dying right after each start stops the whole stack (exit 1). Ctrl-C or
SIGTERM stops the children first (they may still need Redis and S3 while they finish),
then S3, then Valkey; the API's own graceful shutdown (``OMNIQ_SHUTDOWN_GRACE_S``) is
kept shorter than the time it gets, so open SSE streams and WebSockets never get it
killed. Progress goes to stderr; stdout gets one line once every API replica answers and
every worker is ready, or stopped on a configuration error, said with its reason and log
(:mod:`cli.up_ready`: each worker writes a status file, and its output goes to
``<data dir>/logs`` as well).

``--api-replicas N`` runs N APIs on ports ``P … P+N-1`` (each with ``--api-processes``
processes sharing its port): replicas as a load balancer would see them, sharing the
database, Valkey and S3, so a client can move from one to another.

Metrics (docs/metrics.md): each API serves ``/metrics`` on its port; the processes of a
replica with ``--api-processes N`` > 1 share a multiprocess directory
(``<data dir>/metrics/api-PORT``, emptied at start), so any of them reports all. Each
worker serves its own port: the free ones from ``OMNIQ_METRICS__WORKER_PORT`` up (9400
when unset), in the order workers, worker groups, realtime workers, the webhook sender;
the line ``metrics: …`` on stderr lists every scrape URL.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import NoReturn

from cli.data_lock import DataDirInUse, lock_data_dir
from cli.embedded import EmbeddedS3, EmbeddedServiceError, EmbeddedValkey
from cli.up_children import (
    CHILD_STOP_TIMEOUT_S,
    MULTIPROC_ENV,
    STDERR_FD,
    ProcessGroup,
    api_children,
    child_env,
    cli_argv,
    say,
    worker_commands,
)
from cli.up_ready import WorkerWatch, wait_for_workers, wait_healthy
from storage.settings import MetricsSettings, get_settings
from workers.runtime.ports import bindable, reserve_port_from
from workers.runtime.processes import child_popen_kwargs
from workers.runtime.supervisor import GaveUp, RestartPolicy, Supervisor

# A child gets at least this long beyond the API's graceful shutdown before it is killed.
STOP_MARGIN_S = 5.0
SUPERVISE_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 60.0
MIGRATE_TIMEOUT_S = 300.0
# The first worker metrics port ``up`` tries when OMNIQ_METRICS__WORKER_PORT is 0.
WORKER_METRICS_PORT = 9400


class _Signalled(BaseException):
    """SIGINT or SIGTERM arrived: unwind to the shutdown."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise _Signalled(signum)


def _url_host(host: str) -> str:
    """The address a client uses to reach a server bound to ``host``, URL-ready."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cpu_thread_env(environ: Mapping[str, str], processes: int, cores: int) -> dict[str, str]:
    """torchrun's rule for several torch processes on one host: each gets its share of the
    cores as its intra-op threads, so that their pools, a thread per core each, do not
    spin-wait on each other. ``processes``: the worker processes (a group's ranks each
    count). The variables to add to each worker's environment: none when one is set
    already (``environ``) or there is one process (torch's default then)."""
    if processes <= 1 or any(name in environ for name in THREAD_VARS):
        return {}
    return dict.fromkeys(THREAD_VARS, str(max(1, cores // processes)))


def api_metrics_dirs(
    data_dir: Path, port: int, replicas: int, processes: int, metrics: MetricsSettings
) -> dict[int, Path]:
    """The multiprocess metrics directory of each API replica (``port -> directory``),
    emptied: its processes share one port, so a scrape on it must report them all. None
    when a replica is one process (it counts in memory) or metrics are off."""
    if not metrics.enabled or processes < 2:
        return {}
    dirs = {}
    for p in range(port, port + replicas):
        path = data_dir / "metrics" / f"api-{p}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        dirs[p] = path
    return dirs


def worker_metrics_ports(
    host: str, count: int, metrics: MetricsSettings, taken: set[int]
) -> list[int | None]:
    """A metrics port for each of ``count`` workers: the free ones from
    ``OMNIQ_METRICS__WORKER_PORT`` up (9400 when it is 0), skipping ``taken``, each
    reserved (:mod:`workers.runtime.ports`) so two ``up`` starting side by side never pick the
    same one; all None when metrics are off."""
    if not metrics.enabled:
        return [None] * count
    ports: list[int | None] = []
    start = metrics.worker_port or WORKER_METRICS_PORT
    for _ in range(count):
        port = reserve_port_from(start, host, frozenset(taken))
        ports.append(port)
        start = port + 1
    return ports


@dataclass(frozen=True)
class _Stack:
    """What ``up`` runs, its request checked (:func:`run_up`)."""

    host: str
    port: int  # the first API replica's; replica r listens on port + r
    data_dir: Path
    api_processes: int
    api_replicas: int
    workers: int
    realtime_workers: int
    worker_devices: list[str] | None
    groups: list[list[str]] | None
    redis_url: str | None  # an existing Redis instead of the embedded Valkey
    database_url: str | None
    drain_timeout: float  # the workers' OMNIQ_WORKER__DRAIN_TIMEOUT_S
    stop_timeout: float  # how long the children get to stop

    @property
    def urls(self) -> list[str]:
        """The URL of each API replica."""
        return [f"http://{_url_host(self.host)}:{self.port + r}" for r in range(self.api_replicas)]


class _Refused(Exception):
    """``up`` cannot go on: what to say after ``omniqueue up: ``, and the exit status (1;
    2 for a bad command line or configuration, as every command)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_up(
    host: str,
    port: int,
    data_dir: Path,
    workers: int,
    realtime_workers: int = 1,
    database_url: str | None = None,
    api_processes: int = 1,
    api_replicas: int = 1,
    worker_devices: list[str] | None = None,
    groups: list[list[str]] | None = None,
    redis_url: str | None = None,
    drain_timeout: float | None = None,
) -> int:
    """Run the embedded stack until SIGINT/SIGTERM (exit 0), or until a child keeps
    dying however often it is restarted (exit 1). On the way out each worker puts its
    running job back on the queue, or, with ``drain_timeout`` seconds, lets it finish
    first if it ends within them (``OMNIQ_WORKER__DRAIN_TIMEOUT_S``, workers/jobs/shutdown.py).
    A data directory another ``up`` runs on is refused (exit 2) before anything in it is
    written; the lock (:mod:`cli.data_lock`) is held until this function returns.
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = lock_data_dir(data_dir, host, port)
    except DataDirInUse as exc:
        say(f"omniqueue up: {exc}")
        return 2
    try:
        _check_api_ports(host, port, api_processes, api_replicas)
        workers, realtime_workers = _workers_for_the_registry(workers, realtime_workers)
        drain = _drain_timeout(drain_timeout)
    except _Refused as exc:
        lock.release()
        say(f"omniqueue up: {exc}")
        return exc.exit_code
    # The API drains open requests for shutdown_grace_s; it must not be killed meanwhile.
    grace = get_settings().shutdown_grace_s
    stack = _Stack(
        host=host,
        port=port,
        data_dir=data_dir,
        api_processes=api_processes,
        api_replicas=api_replicas,
        workers=workers,
        realtime_workers=realtime_workers,
        worker_devices=worker_devices,
        groups=groups,
        redis_url=redis_url,
        database_url=database_url,
        drain_timeout=drain,
        stop_timeout=max(CHILD_STOP_TIMEOUT_S, grace + STOP_MARGIN_S, drain + STOP_MARGIN_S),
    )
    try:
        return _run(stack)
    finally:
        lock.release()


def _check_api_ports(host: str, port: int, api_processes: int, api_replicas: int) -> None:
    """At least one API replica of at least one process, and each replica's port free."""
    if api_processes < 1 or api_replicas < 1:
        raise _Refused("--api-processes and --api-replicas must be at least 1", exit_code=2)
    for p in range(port, port + api_replicas):
        if not bindable(host, p):
            raise _Refused(f"{host}:{p} is in use (another omniqueue up?); pick --port")


def _drain_timeout(drain_timeout: float | None) -> float:
    """``--drain-timeout``, else ``OMNIQ_WORKER__DRAIN_TIMEOUT_S``; at least 0."""
    settings = get_settings()
    drain = settings.worker.drain_timeout_s if drain_timeout is None else drain_timeout
    if drain < 0:
        raise _Refused("--drain-timeout must be at least 0", exit_code=2)
    return drain


def _run(stack: _Stack) -> int:
    """Start the stack, say it is up and supervise it; stop everything on the way out,
    whichever way that is (a signal: exit 0; a failure or a child that keeps dying: 1)."""
    valkey = None if stack.redis_url else EmbeddedValkey(stack.data_dir / "valkey")
    s3 = EmbeddedS3(stack.data_dir / "s3", bucket="omniqueue")
    children: ProcessGroup | None = None
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        env = _start_services(stack, valkey, s3)
        children = ProcessGroup(env)  # before the first spawn: the shutdown stops them
        watches = _spawn_children(stack, children, env)
        supervisor = _supervisor(children, s3, valkey, watches)
        _wait_ready(stack, children, env, supervisor, watches)
        _supervise(supervisor)
    except GaveUp as exc:
        say(f"omniqueue up: {exc}; stopping everything")
        return 1
    except _Signalled:
        say("shutting down…")
        return 0
    except (_Refused, EmbeddedServiceError, OSError, subprocess.TimeoutExpired) as exc:
        say(f"omniqueue up: {exc}")
        return 1
    finally:
        # Further signals are ignored: every step below is bounded in time.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        _shutdown(children, s3, valkey, stack.stop_timeout)
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _start_services(stack: _Stack, valkey: EmbeddedValkey | None, s3: EmbeddedS3) -> dict[str, str]:
    """Start Valkey (unless ``up`` uses an existing Redis) and S3 and migrate the
    database; the environment of the API and worker children."""
    if valkey is not None:
        say(f"starting valkey… (data in {valkey.data_dir})")
        valkey.start()
    say(f"starting S3 (SeaweedFS)… (data in {s3.data_dir})")
    s3.start()
    redis = stack.redis_url or valkey.url  # type: ignore[union-attr]
    env = child_env(stack.host, stack.port, stack.data_dir, redis, s3, stack.database_url)
    say("migrating the database…")
    migrate = subprocess.run(
        cli_argv("migrate", "--quiet"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=STDERR_FD,
        timeout=MIGRATE_TIMEOUT_S,
        check=False,
        **child_popen_kwargs(signal.SIGTERM),
    )
    if migrate.returncode != 0:
        raise _Refused(f"migration failed with code {migrate.returncode}")
    env["OMNIQ_WORKER__DRAIN_TIMEOUT_S"] = f"{stack.drain_timeout:g}"
    if stack.api_processes > 1:  # they share the port; the kernel spreads connections
        env["OMNIQ_HTTP__REUSE_PORT"] = "true"
    return env


def _spawn_children(
    stack: _Stack, children: ProcessGroup, env: dict[str, str]
) -> list[WorkerWatch]:
    """The API processes, the workers and the webhook sender; the ``metrics:`` line. What
    to watch of each worker."""
    say(
        f"starting the API on {' '.join(stack.urls)} ({stack.api_processes} process(es) "
        f"each), {stack.workers} worker(s), {stack.realtime_workers} realtime worker(s) and "
        "the webhook sender…"
    )
    metrics = get_settings().metrics
    dirs = api_metrics_dirs(
        stack.data_dir, stack.port, stack.api_replicas, stack.api_processes, metrics
    )
    for name, api_port in api_children(stack.port, stack.api_replicas, stack.api_processes):
        directory = dirs.get(api_port)
        children.spawn(
            name,
            cli_argv("api", "--host", stack.host, "--port", str(api_port)),
            {MULTIPROC_ENV: str(directory)} if directory else None,
        )
    scraped, watches = _spawn_workers(stack, children, env, metrics)
    if metrics.enabled:
        scrape = [f"API {u}/metrics" for u in stack.urls]
        scrape += [f"{name} http://{_url_host(stack.host)}:{p}/metrics" for name, p in scraped]
        say("metrics: " + ", ".join(scrape))
    return watches


def _spawn_workers(
    stack: _Stack, children: ProcessGroup, env: dict[str, str], metrics: MetricsSettings
) -> tuple[list[tuple[str, int | None]], list[WorkerWatch]]:
    """The workers, each with its share of the cores, a status file and a log file, then
    the webhook sender: its own process, so a slow receiver holds no worker or API. Each
    child's metrics port, and what to watch of each worker."""
    spawned = worker_commands(
        stack.workers, stack.worker_devices, stack.groups, stack.realtime_workers
    )
    worker_children = len(spawned)
    ranks = stack.workers + sum(len(g) for g in stack.groups or []) + stack.realtime_workers
    threads = cpu_thread_env(env, ranks, len(os.sched_getaffinity(0)))
    if threads:
        say(
            f"each of the {ranks} worker processes runs torch on "
            f"{threads['OMP_NUM_THREADS']} CPU thread(s) (OMP_NUM_THREADS: set it to choose)"
        )
    spawned.append(("webhook sender", cli_argv("webhooks", "serve")))
    taken = set(range(stack.port, stack.port + stack.api_replicas))
    ports = worker_metrics_ports(stack.host, len(spawned), metrics, taken)
    watches = []
    for i, ((name, argv), metrics_port) in enumerate(zip(spawned, ports, strict=True)):
        extra = dict(threads) if i < worker_children else {}  # the workers' share
        if metrics_port is not None:
            extra["OMNIQ_METRICS__WORKER_PORT"] = str(metrics_port)
            extra["OMNIQ_METRICS__WORKER_HOST"] = stack.host
        watch = WorkerWatch.of(stack.data_dir, name, argv) if i < worker_children else None
        if watch is not None:
            watch.reset()
            extra.update(watch.env)
            watches.append(watch)
        children.spawn(name, argv, extra or None, watch.log_file if watch else None)
    return [(name, p) for (name, _), p in zip(spawned, ports, strict=True)], watches


def _wait_ready(
    stack: _Stack,
    children: ProcessGroup,
    env: dict[str, str],
    supervisor: Supervisor,
    watches: list[WorkerWatch],
) -> None:
    """Wait for every API replica's ``/health``, then for every worker to be ready (or
    left stopped, which is said with its reason), then say on stdout that the stack is
    up (with how to make a key where auth is required)."""
    apis = [name for name, _ in api_children(stack.port, stack.api_replicas, stack.api_processes)]
    problem = wait_healthy(stack.urls, partial(children.first_exited, apis), HEALTH_TIMEOUT_S)
    if problem is not None:
        raise _Refused(problem)
    if watches:
        say(
            f"the API answers on {' '.join(stack.urls)}; waiting for {len(watches)} "
            f"worker(s) to load their models (their logs: {stack.data_dir / 'logs'})…"
        )
    stopped = wait_for_workers(watches, supervisor, say)
    if env["OMNIQ_AUTH"] == "required":
        database = (
            f"--database-url {shlex.quote(stack.database_url)}"
            if stack.database_url
            else f"--data-dir {shlex.quote(str(stack.data_dir))}"
        )
        say(
            f"auth is required on {stack.host}; create a key with: "
            f"omniqueue keys create {database} --name NAME"
        )
    urls = stack.urls
    replicas = f"  (API replicas: {' '.join(urls)})" if len(urls) > 1 else ""
    down = f"; stopped: {', '.join(w.label for w in stopped)} (see above)" if stopped else ""
    print(f"omniqueue is up: {urls[0]}  (data: {stack.data_dir}){replicas}{down}", flush=True)


def _supervisor(
    children: ProcessGroup,
    s3: EmbeddedS3,
    valkey: EmbeddedValkey | None,
    watches: list[WorkerWatch],
) -> Supervisor:
    """Everything ``up`` runs, supervised; a worker's status file is cleared before each
    restart, and its configuration error said with its reasons and log."""
    supervisor = Supervisor(say, RestartPolicy(backoff_s=get_settings().restart_backoff_s))
    if valkey is not None:
        supervisor.add("valkey", valkey.exit_code, valkey.restart)
    supervisor.add("S3 (SeaweedFS)", s3.exit_code, s3.restart)
    by_name = {w.name: w for w in watches}
    for name in children.names:
        watch = by_name.get(name)
        restart = partial(children.respawn, name)
        if watch is not None:
            restart = partial(_restart_worker, watch, restart)
        supervisor.add(
            name,
            partial(children.exit_code, name),
            restart,
            watch.stopped if watch is not None else None,
        )
    return supervisor


def _restart_worker(watch: WorkerWatch, respawn: Callable[[], None]) -> None:
    watch.reset()
    respawn()


def _supervise(supervisor: Supervisor) -> NoReturn:
    """Restart whatever dies, until a signal or :class:`GaveUp` ends it."""
    while True:
        supervisor.check()
        time.sleep(SUPERVISE_INTERVAL_S)


def _workers_for_the_registry(workers: int, realtime_workers: int) -> tuple[int, int]:
    """The job and realtime worker counts, less those with no model to serve: a realtime
    worker of a registry without a streaming model (or a job worker of one with only
    streaming models) could only exit, and be restarted, again and again. Said once."""
    try:
        served = get_settings().served_models().values()
    except ValueError as exc:  # the registry file or OMNIQ_MODELS: a bad configuration
        raise _Refused(str(exc), exit_code=2) from exc
    if realtime_workers and not any(m.spec.streaming for m in served):
        say(
            "omniqueue up: no streaming model is served, so no realtime worker starts; "
            "/v1/realtime and /v1/realtime/video refuse sessions, naming the model they "
            "lack (serve reference/voice or reference/world, or a registry entry of one)"
        )
        realtime_workers = 0
    if workers and not any(not m.spec.streaming for m in served):
        say("omniqueue up: only streaming models are served, so no job worker starts")
        workers = 0
    return workers, realtime_workers


def _shutdown(
    children: ProcessGroup | None, s3: EmbeddedS3, valkey: EmbeddedValkey | None, timeout: float
) -> None:
    if children is not None:
        say("stopping the API and workers…")
        children.stop(timeout)
    say("stopping S3…")
    s3.stop()
    if valkey is not None:
        say("stopping valkey…")
        valkey.stop()
    say("stopped")
