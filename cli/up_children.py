"""The children of ``omniqueue up`` (:mod:`cli.up`): their names, command lines and
environment (:func:`api_children`, :func:`worker_commands`, :func:`child_env`), and the
:class:`ProcessGroup` that runs them, each the leader of its own process group, started
again with the same command line when the supervisor restarts one, and stopped together."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import IO

from prometheus_client.multiprocess import mark_process_dead

from cli.embedded import EmbeddedS3
from workers.runtime.processes import child_popen_kwargs, kill_process_group

CHILD_STOP_TIMEOUT_S = 10.0
# How long a stop waits for a child's last output to reach its log (and our stderr).
COPY_DRAIN_S = 2.0
STDERR_FD = 2
MULTIPROC_ENV = "OMNIQ_METRICS__MULTIPROC_DIR"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


def say(message: str) -> None:
    """A line of progress on stderr (stdout keeps the one "is up" line)."""
    print(message, file=sys.stderr, flush=True)


class ProcessGroup:
    """Named child processes, each the leader of its own process group.

    Their stdout and stderr go to our stderr, so stdout stays for the "is up" line; a
    child spawned with a ``log`` file also has its output copied there (emptied when it
    first starts, appended to on restarts), so a message can say where to read it.
    """

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}
        self._extra: dict[str, dict[str, str]] = {}
        self._logs: dict[str, Path | None] = {}
        self._copiers: dict[str, threading.Thread] = {}

    @property
    def names(self) -> list[str]:
        return list(self._procs)

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> None:
        """Start ``name``; ``env``: variables of this child on top of the group's;
        ``log``: a file that gets a copy of its output."""
        first = name not in self._argv
        self._argv[name] = argv
        self._extra[name] = env or {}
        self._logs[name] = log
        proc = subprocess.Popen(
            argv,
            env={**self._env, **self._extra[name]},
            stdin=subprocess.DEVNULL,
            stdout=STDERR_FD if log is None else subprocess.PIPE,
            stderr=STDERR_FD if log is None else subprocess.STDOUT,
            **child_popen_kwargs(signal.SIGTERM),
        )
        self._procs[name] = proc
        if log is not None and proc.stdout is not None:
            copier = threading.Thread(
                target=_copy_output,
                args=(proc.stdout, log, "wb" if first else "ab"),
                name=f"output of {name}",
                daemon=True,
            )
            copier.start()
            self._copiers[name] = copier

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
        self.spawn(name, self._argv[name], self._extra[name], self._logs[name])

    def first_exited(self, among: Collection[str] | None = None) -> tuple[str, int] | None:
        """The name and exit code of a child (of ``among``, when given) that has exited,
        if any."""
        for name, proc in self._procs.items():
            if among is not None and name not in among:
                continue
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
                say(f"{name} did not stop within {timeout:.0f} s; killing it")
                kill_process_group(proc.pid)
                proc.wait()
            kill_process_group(proc.pid)  # leftovers in its group
        for copier in self._copiers.values():  # the last lines, before up's own exit
            copier.join(COPY_DRAIN_S)
        self._procs.clear()
        self._copiers.clear()


def _copy_output(pipe: IO[bytes], log: Path, mode: str) -> None:
    """Copy a child's output, as it comes, to our stderr and to ``log`` (mode ``wb`` or
    ``ab``), until the child and whatever inherited its pipe are gone. A stderr that
    cannot be written (closed) leaves the log file going, so the child never blocks."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with pipe, open(log, mode) as out:
        while chunk := os.read(pipe.fileno(), 65536):
            out.write(chunk)
            out.flush()
            with contextlib.suppress(OSError):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(STDERR_FD, view) :]


def cli_argv(*args: str) -> list[str]:
    """The command line of ``omniqueue ARGS…`` in this interpreter."""
    return [sys.executable, "-m", "cli.main", *args]


def api_children(port: int, replicas: int, processes: int) -> list[tuple[str, int]]:
    """``(name, port)`` of every API process: replica r listens on ``port + r``, with
    ``processes`` processes sharing that port. The first replica keeps the names ``api``,
    ``api 1``, …; the others are ``api :PORT``, ``api :PORT 1``, …"""
    out = []
    for r in range(replicas):
        base = "api" if r == 0 else f"api :{port + r}"
        out += [(base if i == 0 else f"{base} {i}", port + r) for i in range(processes)]
    return out


def worker_commands(
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
        out.append((f"worker {i}", cli_argv("worker", "--name", f"embedded-{i}", *device)))
    for i, devices in enumerate(groups or []):
        argv = cli_argv("worker", "--name", f"embedded-group{i}", "--devices", ",".join(devices))
        out.append((f"worker group {i}", argv))
    for i in range(realtime_workers):
        name = "embedded-rt" if i == 0 else f"embedded-rt{i}"
        out.append((f"realtime worker {i}", cli_argv("worker", "--realtime", "--name", name)))
    return out


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
