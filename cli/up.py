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
killed. Progress goes to stderr; stdout gets one line once every API replica answers.

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
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from types import FrameType

import httpx
from prometheus_client.multiprocess import mark_process_dead

from cli.embedded import EmbeddedS3, EmbeddedServiceError, EmbeddedValkey
from storage.settings import MetricsSettings, get_settings
from workers.runtime.ports import bindable, reserve_port_from
from workers.runtime.processes import child_popen_kwargs, kill_process_group
from workers.runtime.supervisor import GaveUp, Supervisor

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
CHILD_STOP_TIMEOUT_S = 10.0
# A child gets at least this long beyond the API's graceful shutdown before it is killed.
STOP_MARGIN_S = 5.0
SUPERVISE_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 60.0
MIGRATE_TIMEOUT_S = 300.0
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_STDERR_FD = 2
MULTIPROC_ENV = "OMNIQ_METRICS__MULTIPROC_DIR"
# The first worker metrics port ``up`` tries when OMNIQ_METRICS__WORKER_PORT is 0.
WORKER_METRICS_PORT = 9400


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _Signalled(BaseException):
    """SIGINT or SIGTERM arrived: unwind to the shutdown."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise _Signalled(signum)


class ProcessGroup:
    """Named child processes, each the leader of its own process group.

    Their stdout and stderr go to our stderr, so stdout stays for the "is up" line.
    """

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}
        self._extra: dict[str, dict[str, str]] = {}

    @property
    def names(self) -> list[str]:
        return list(self._procs)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``name``; ``env``: variables of this child on top of the group's."""
        self._argv[name] = argv
        self._extra[name] = env or {}
        self._procs[name] = subprocess.Popen(
            argv,
            env={**self._env, **self._extra[name]},
            stdin=subprocess.DEVNULL,
            stdout=_STDERR_FD,
            stderr=_STDERR_FD,
            **child_popen_kwargs(signal.SIGTERM),
        )

    def exit_code(self, name: str) -> int | None:
        return self._procs[name].poll()

    def respawn(self, name: str) -> None:
        """Start ``name`` again with the same command line, after what is left of its
        process group (a dead worker's own children) is killed. A dead API process's
        live gauges leave its metrics directory (it could not remove them itself)."""
        pid = self._procs[name].pid
        kill_process_group(pid)
        metrics_dir = self._extra[name].get(MULTIPROC_ENV)
        if metrics_dir:
            mark_process_dead(pid, metrics_dir)
        self.spawn(name, self._argv[name], self._extra[name])

    def first_exited(self) -> tuple[str, int] | None:
        """The name and exit code of a child that has exited, if any."""
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    def stop(self, timeout: float = CHILD_STOP_TIMEOUT_S) -> None:
        """SIGTERM every child's group at once, SIGKILL what is left after ``timeout`` s."""
        for proc in self._procs.values():
            if proc.poll() is None:
                kill_process_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, proc in self._procs.items():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(f"{name} did not stop within {timeout:.0f} s; killing it")
                kill_process_group(proc.pid)
                proc.wait()
            kill_process_group(proc.pid)  # leftovers in its group
        self._procs.clear()


def _url_host(host: str) -> str:
    """The address a client uses to reach a server bound to ``host``, URL-ready."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


def _pythonpath() -> str:
    """PYTHONPATH for the children: the project root first, unless it is installed."""
    current = os.environ.get("PYTHONPATH", "")
    installed = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    if str(_PROJECT_ROOT) in installed:
        return current
    return os.pathsep.join(p for p in (str(_PROJECT_ROOT), current) if p)


def child_env(
    host: str,
    port: int,
    data_dir: Path,
    redis_url: str,
    s3: EmbeddedS3,
    database_url: str | None = None,
) -> dict[str, str]:
    """The environment of ``omniqueue api/worker/migrate`` for the embedded stack."""
    env = dict(os.environ)
    env.update(
        {
            "OMNIQ_MODE": "embedded",
            "OMNIQ_DATA_DIR": str(data_dir),
            "OMNIQ_DATABASE__URL": database_url or f"sqlite:///{data_dir / 'omniqueue.db'}",
            "OMNIQ_REDIS__URL": redis_url,
            "OMNIQ_S3__ENDPOINT_URL": s3.endpoint_url,
            "OMNIQ_S3__BUCKET": s3.bucket,
            "OMNIQ_S3__ACCESS_KEY_ID": s3.access_key,
            "OMNIQ_S3__SECRET_ACCESS_KEY": s3.secret_key,
            # Keys are optional on loopback unless asked for (OMNIQ_AUTH=required: per-key
            # quotas and fair share need callers told apart), required anywhere else.
            "OMNIQ_AUTH": "off"
            if host in LOOPBACK_HOSTS and os.environ.get("OMNIQ_AUTH") != "required"
            else "required",
            "OMNIQ_HOST": host,
            "OMNIQ_PORT": str(port),
            "PYTHONPATH": _pythonpath(),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if host in LOOPBACK_HOSTS:  # a receiver on this machine is the usual local setup
        env.setdefault("OMNIQ_WEBHOOKS__ALLOW_PRIVATE", "true")
    return env


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


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def _wait_healthy(urls: list[str], children: ProcessGroup, timeout: float) -> str | None:
    """Wait for ``GET /health`` to answer 200 on every URL; the reason it did not, or None."""
    deadline = time.monotonic() + timeout
    waiting = list(urls)
    with httpx.Client(timeout=2.0, trust_env=False) as client:  # never via an HTTP proxy
        while time.monotonic() < deadline:
            exited = children.first_exited()
            if exited is not None:
                return f"{exited[0]} exited with code {exited[1]} during startup"
            try:
                while waiting and client.get(f"{waiting[0]}/health").status_code == 200:
                    waiting.pop(0)
            except httpx.HTTPError:
                pass
            if not waiting:
                return None
            time.sleep(0.25)
    return f"the API did not answer {waiting[0]}/health within {timeout:.0f} s"


def api_children(port: int, replicas: int, processes: int) -> list[tuple[str, int]]:
    """``(name, port)`` of every API process: replica r listens on ``port + r``, with
    ``processes`` processes sharing that port. The first replica keeps the names ``api``,
    ``api 1``, …; the others are ``api :PORT``, ``api :PORT 1``, …"""
    out = []
    for r in range(replicas):
        base = "api" if r == 0 else f"api :{port + r}"
        out += [(base if i == 0 else f"{base} {i}", port + r) for i in range(processes)]
    return out


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
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    urls = [f"http://{_url_host(host)}:{port + r}" for r in range(max(api_replicas, 1))]
    url = urls[0]
    if api_processes < 1 or api_replicas < 1:
        _say("omniqueue up: --api-processes and --api-replicas must be at least 1")
        return 1
    for p in range(port, port + api_replicas):
        if not bindable(host, p):
            _say(f"omniqueue up: {host}:{p} is in use (another omniqueue up?); pick --port")
            return 1
    try:
        workers, realtime_workers = _workers_for_the_registry(workers, realtime_workers)
    except ValueError as exc:  # the registry file or OMNIQ_MODELS
        _say(f"omniqueue up: {exc}")
        return 1
    # The API drains open requests for shutdown_grace_s; it must not be killed meanwhile.
    settings = get_settings()
    drain = settings.worker.drain_timeout_s if drain_timeout is None else drain_timeout
    if drain < 0:
        _say("omniqueue up: --drain-timeout must be at least 0")
        return 1
    stop_timeout = max(
        CHILD_STOP_TIMEOUT_S, settings.shutdown_grace_s + STOP_MARGIN_S, drain + STOP_MARGIN_S
    )
    # ``redis_url``: an existing Redis (its database is the broker's and the events')
    # instead of the embedded Valkey.
    valkey = None if redis_url else EmbeddedValkey(data_dir / "valkey")
    s3 = EmbeddedS3(data_dir / "s3", bucket="omniqueue")
    children: ProcessGroup | None = None
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if valkey is not None:
            _say(f"starting valkey… (data in {valkey.data_dir})")
            valkey.start()
        _say(f"starting S3 (SeaweedFS)… (data in {s3.data_dir})")
        s3.start()
        redis = redis_url or valkey.url  # type: ignore[union-attr]
        env = child_env(host, port, data_dir, redis, s3, database_url)
        _say("migrating the database…")
        migrate = subprocess.run(
            _cli("migrate"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=_STDERR_FD,
            timeout=MIGRATE_TIMEOUT_S,
            check=False,
            **child_popen_kwargs(signal.SIGTERM),
        )
        if migrate.returncode != 0:
            _say(f"omniqueue up: migration failed with code {migrate.returncode}")
            return 1
        _say(
            f"starting the API on {' '.join(urls)} ({api_processes} process(es) each), "
            f"{workers} worker(s), {realtime_workers} realtime worker(s) and the webhook sender…"
        )
        env["OMNIQ_WORKER__DRAIN_TIMEOUT_S"] = f"{drain:g}"
        if api_processes > 1:  # they share the port; the kernel spreads connections
            env["OMNIQ_HTTP__REUSE_PORT"] = "true"
        metrics = get_settings().metrics
        metrics_dirs = api_metrics_dirs(data_dir, port, api_replicas, api_processes, metrics)
        children = ProcessGroup(env)
        for name, api_port in api_children(port, api_replicas, api_processes):
            directory = metrics_dirs.get(api_port)
            children.spawn(
                name,
                _cli("api", "--host", host, "--port", str(api_port)),
                {MULTIPROC_ENV: str(directory)} if directory else None,
            )
        spawned = _worker_commands(workers, worker_devices, groups, realtime_workers)
        worker_children = len(spawned)
        ranks = workers + sum(len(g) for g in groups or []) + realtime_workers
        threads = cpu_thread_env(env, ranks, len(os.sched_getaffinity(0)))
        if threads:
            _say(
                f"each of the {ranks} worker processes runs torch on "
                f"{threads['OMP_NUM_THREADS']} CPU thread(s) (OMP_NUM_THREADS: set it to choose)"
            )
        # the webhook sender: its own process, so a slow receiver holds no worker or API
        spawned.append(("webhook sender", _cli("webhooks", "serve")))
        taken = set(range(port, port + api_replicas))
        ports = worker_metrics_ports(host, len(spawned), metrics, taken)
        for i, ((name, argv), metrics_port) in enumerate(zip(spawned, ports, strict=True)):
            extra = dict(threads) if i < worker_children else {}  # the workers' share
            if metrics_port is not None:
                extra["OMNIQ_METRICS__WORKER_PORT"] = str(metrics_port)
                extra["OMNIQ_METRICS__WORKER_HOST"] = host
            children.spawn(name, argv, extra or None)
        if metrics.enabled:
            scrape = [f"API {u}/metrics" for u in urls]
            scrape += [
                f"{name} http://{_url_host(host)}:{p}/metrics"
                for (name, _), p in zip(spawned, ports, strict=True)
            ]
            _say("metrics: " + ", ".join(scrape))
        problem = _wait_healthy(urls, children, HEALTH_TIMEOUT_S)
        if problem is not None:
            _say(f"omniqueue up: {problem}")
            return 1
        if env["OMNIQ_AUTH"] == "required":
            _say(
                f"auth is required on {host}; create a key with: "
                f"OMNIQ_DATABASE__URL={env['OMNIQ_DATABASE__URL']} "
                "omniqueue keys create --name NAME"
            )
        replicas = f"  (API replicas: {' '.join(urls)})" if len(urls) > 1 else ""
        print(f"omniqueue is up: {url}  (data: {data_dir}){replicas}", flush=True)
        supervisor = Supervisor(_say)
        if valkey is not None:
            supervisor.add("valkey", valkey.exit_code, valkey.restart)
        supervisor.add("S3 (SeaweedFS)", s3.exit_code, s3.restart)
        for name in children.names:
            supervisor.add(name, partial(children.exit_code, name), partial(children.respawn, name))
        while True:
            supervisor.check()
            time.sleep(SUPERVISE_INTERVAL_S)
    except GaveUp as exc:
        _say(f"omniqueue up: {exc}; stopping everything")
        return 1
    except _Signalled:
        _say("shutting down…")
        return 0
    except (EmbeddedServiceError, OSError, subprocess.TimeoutExpired) as exc:
        _say(f"omniqueue up: {exc}")
        return 1
    finally:
        # Further signals are ignored: every step below is bounded in time.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        _shutdown(children, s3, valkey, stop_timeout)
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _workers_for_the_registry(workers: int, realtime_workers: int) -> tuple[int, int]:
    """The job and realtime worker counts, less those with no model to serve: a realtime
    worker of a registry without a streaming model (or a job worker of one with only
    streaming models) could only exit, and be restarted, again and again. Said once."""
    served = get_settings().served_models().values()
    if realtime_workers and not any(m.spec.streaming for m in served):
        _say(
            "omniqueue up: no streaming model is served, so no realtime worker starts; "
            "/v1/realtime and /v1/realtime/video refuse sessions, naming the model they "
            "lack (serve reference/voice or reference/world, or a registry entry of one)"
        )
        realtime_workers = 0
    if workers and not any(not m.spec.streaming for m in served):
        _say("omniqueue up: only streaming models are served, so no job worker starts")
        workers = 0
    return workers, realtime_workers


def _worker_commands(
    workers: int,
    worker_devices: list[str] | None,
    groups: list[list[str]] | None,
    realtime_workers: int,
) -> list[tuple[str, list[str]]]:
    """``(name, argv)`` of every worker child: the job workers (one per listed device
    when there is a list, ``--worker-devices cuda:0,cuda:1``), the worker groups, and the
    realtime workers (``OMNIQ_REALTIME__SLOTS`` session threads each)."""
    out = []
    for i in range(workers):
        device = ["--device", worker_devices[i]] if worker_devices else []
        out.append((f"worker {i}", _cli("worker", "--name", f"embedded-{i}", *device)))
    for i, devices in enumerate(groups or []):
        argv = _cli("worker", "--name", f"embedded-group{i}", "--devices", ",".join(devices))
        out.append((f"worker group {i}", argv))
    for i in range(realtime_workers):
        name = "embedded-rt" if i == 0 else f"embedded-rt{i}"
        out.append((f"realtime worker {i}", _cli("worker", "--realtime", "--name", name)))
    return out


def _shutdown(
    children: ProcessGroup | None, s3: EmbeddedS3, valkey: EmbeddedValkey | None, timeout: float
) -> None:
    if children is not None:
        _say("stopping the API and workers…")
        children.stop(timeout)
    _say("stopping S3…")
    s3.stop()
    if valkey is not None:
        _say("stopping valkey…")
        valkey.stop()
    _say("stopped")
