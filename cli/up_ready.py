"""``omniqueue up`` says it is up once its workers are: each worker writes a status file
when Celery consumes, or when it could load none of its models
(``OMNIQ_WORKER__STATUS_FILE``, ``workers/runtime/status_file.py``), and its output is
copied to a log file of its own (``<data dir>/logs/<worker>.log``), so what ``up`` says
of a worker can name the models it could not load, why, and where to read the rest.

A worker that loads none of its models exits with code 78 (a configuration error): it
is left stopped, the rest of the stack runs on (the API serves the other models; a
model that cannot load never takes the stack down), and ``up`` says which worker, which
model, the reason and the log's path, before it says it is up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from workers.runtime.status_file import clear_status, read_status
from workers.runtime.supervisor import CONFIG_ERROR, Supervisor

# How often the wait looks at the workers, and how often it says whom it still waits for.
TICK_S = 0.25
REPORT_EVERY_S = 30.0


@dataclass(frozen=True)
class WorkerWatch:
    """One worker child of ``up``: its name there (``worker 0``), its own (``--name``),
    its status file and its log file."""

    name: str
    process: str
    status_file: Path
    log_file: Path

    @classmethod
    def of(cls, data_dir: Path, name: str, argv: list[str]) -> WorkerWatch:
        slug = name.replace(" ", "-")
        process = argv[argv.index("--name") + 1] if "--name" in argv else name
        return cls(
            name,
            process,
            data_dir / "run" / f"{slug}.status.json",
            data_dir / "logs" / f"{slug}.log",
        )

    @property
    def env(self) -> dict[str, str]:
        """The variable that tells the worker where to write its status."""
        return {"OMNIQ_WORKER__STATUS_FILE": str(self.status_file)}

    @property
    def label(self) -> str:
        return f"{self.name} ({self.process})"

    def reset(self) -> None:
        """Before each start: an earlier start's status never counts."""
        clear_status(self.status_file)

    def ready(self) -> str | None:
        """The line that says it is ready (with the models it could not load), once it
        consumes; None before."""
        status = read_status(self.status_file)
        if status is None or status.state != "ready":
            return None
        line = f"{self.label} is ready: {', '.join(status.models)}"
        if status.failed:
            line += f"; it could not load {_reasons(status.failed)} (its log: {self.log_file})"
        return line

    def stopped(self) -> str:
        """What to say when it exits on a configuration error (code 78)."""
        status = read_status(self.status_file)
        if status is not None and status.state == "stopped" and status.failed:
            why = f"could not load {_reasons(status.failed)}"
            after = (
                "The API runs on and serves the other models; /ready, /health and "
                "/v1/models name these as unavailable, and their creates get 503 "
                "model_unavailable."
            )
        else:
            why = "stopped on a configuration error (its reason is in its log)"
            after = "The rest of the stack runs on."
        return (
            f"{self.label} {why}. It exited with code {CONFIG_ERROR}, a configuration "
            f"error that a restart cannot mend, so it stays stopped. {after} Its log: "
            f"{self.log_file}"
        )


def wait_healthy(
    urls: list[str], exited: Callable[[], tuple[str, int] | None], timeout: float
) -> str | None:
    """Wait for ``GET /health`` to answer 200 on every URL; the reason it did not, or
    None. ``exited``: an API process that exited meanwhile (name, code), which ends the
    wait at once (a port taken, a bad setting: restarting it would not help)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per poll is noise here
    deadline = time.monotonic() + timeout
    waiting = list(urls)
    with httpx.Client(timeout=2.0, trust_env=False) as client:  # never via an HTTP proxy
        while time.monotonic() < deadline:
            gone = exited()
            if gone is not None:
                return f"{gone[0]} exited with code {gone[1]} during startup"
            try:
                while waiting and client.get(f"{waiting[0]}/health").status_code == 200:
                    waiting.pop(0)
            except httpx.HTTPError:
                pass
            if not waiting:
                return None
            time.sleep(TICK_S)
    return f"the API did not answer {waiting[0]}/health within {timeout:.0f} s"


def _reasons(failed: dict[str, str]) -> str:
    return "; ".join(f"{model!r}: {reason}" for model, reason in failed.items())


def wait_for_workers(
    watches: list[WorkerWatch],
    supervisor: Supervisor,
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> list[WorkerWatch]:
    """Supervise until every worker is ready or left stopped on a configuration error
    (:meth:`WorkerWatch.stopped` said by the supervisor), saying each ready one and,
    every :data:`REPORT_EVERY_S`, whom it still waits for. The stopped ones."""
    pending = list(watches)
    stopped: list[WorkerWatch] = []
    started = time.monotonic()
    report_at = started + REPORT_EVERY_S
    while pending:
        supervisor.check()  # restarts what died; GaveUp when one keeps dying
        for watch in list(pending):
            line = watch.ready()
            if line is not None:
                say(line)
            elif supervisor.left_stopped(watch.name):
                stopped.append(watch)
            else:
                continue
            pending.remove(watch)
        if pending and time.monotonic() >= report_at:
            report_at += REPORT_EVERY_S
            names = ", ".join(w.label for w in pending)
            logs = ", ".join(str(w.log_file) for w in pending)
            say(
                f"still waiting for {names} to load their models "
                f"({time.monotonic() - started:.0f} s; logs: {logs})"
            )
        if pending:
            sleep(TICK_S)
    return stopped
