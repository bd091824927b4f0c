"""Restart what dies: the supervision loop of ``omniqueue up`` (:mod:`cli.up`) and of a
worker group's ranks (:mod:`workers.runtime.group`). It lives with the workers, which must not
import ``cli`` (the worker image installs no ``embedded`` extra).

Every supervised thing (a child process — the API, a worker — or an embedded service —
Valkey, SeaweedFS) is a :class:`Supervised`: a way to read its exit code and a way to
start it again. :meth:`Supervisor.check`, called every tick, restarts a dead one after a
backoff (1 s, 2 s, 4 s, … at most ``max_backoff_s``) with a log line each time. A thing
that keeps dying soon after each start (``max_fast_failures`` times in a row, each within
``stable_after_s`` of its start) makes :meth:`check` raise :class:`GaveUp`; the caller
then stops everything. One that ran ``stable_after_s`` before dying starts a fresh count.
One that exits with :data:`CONFIG_ERROR` said why before it exited (a registry that serves
it no model, a setting it cannot use): a restart cannot fix that, so it is reported once
and left stopped while the rest runs on. One that exits 0 was stopped on purpose (a
SIGTERM sent to that process alone: a worker then puts its job back first): it is
started again at once and no failure is counted, unless it exits 0 within
``min_run_s`` of its start, which is a fault like any other exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# sysexits' EX_CONFIG: what a child exits with when its configuration, not a fault, stops it.
CONFIG_ERROR = 78


class GaveUp(Exception):
    """A supervised thing failed too often in a row; its message says which and how."""


@dataclass
class RestartPolicy:
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    stable_after_s: float = 30.0
    max_fast_failures: int = 5
    min_run_s: float = 1.0  # an exit 0 sooner than this counts as a failure


@dataclass
class Supervised:
    """``exit_code()``: None while it runs. ``restart()``: start it again (blocking until
    it is ready); any exception it raises counts as another failure."""

    name: str
    exit_code: Callable[[], int | None]
    restart: Callable[[], None]
    started_at: float
    failures: int = 0
    restart_at: float | None = None  # set while it is dead and waiting for its restart
    restarts: int = 0
    left_stopped: bool = False  # it exited with CONFIG_ERROR
    # What to say when it exits with CONFIG_ERROR (which thing, why, where its log is);
    # None: that it stopped on a configuration error whose reason is above.
    explain: Callable[[], str] | None = None


class Supervisor:
    def __init__(
        self,
        say: Callable[[str], None],
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "omniqueue up",
    ) -> None:
        self._say = say
        self._label = label
        self.policy = policy or RestartPolicy()
        self._clock = clock
        self._items: list[Supervised] = []

    def add(
        self,
        name: str,
        exit_code: Callable[[], int | None],
        restart: Callable[[], None],
        explain: Callable[[], str] | None = None,
    ) -> None:
        self._items.append(
            Supervised(name, exit_code, restart, started_at=self._clock(), explain=explain)
        )

    def left_stopped(self, name: str) -> bool:
        """Whether ``name`` exited on a configuration error and is left stopped."""
        return any(item.left_stopped for item in self._items if item.name == name)

    def check(self) -> None:
        """Notice deaths and perform due restarts; :class:`GaveUp` when one failed too often."""
        for item in self._items:
            if item.left_stopped:
                continue
            if item.restart_at is None:
                code = item.exit_code()
                if code == CONFIG_ERROR:
                    item.left_stopped = True
                    self._say(f"{self._label}: {self._config_error(item)}")
                elif code == 0 and self._clock() - item.started_at >= self.policy.min_run_s:
                    self._say(
                        f"{self._label}: {item.name} stopped (exit code 0: it was told to "
                        "stop); starting it again"
                    )
                    self._restart(item)
                elif code is not None:
                    self._failed(item, f"exited with code {code}")
            elif self._clock() >= item.restart_at:
                self._restart(item)

    @staticmethod
    def _config_error(item: Supervised) -> str:
        if item.explain is not None:
            return item.explain()
        return (
            f"{item.name} stopped on a configuration error (exit code {CONFIG_ERROR}; its "
            "reason is above); a restart cannot fix it, so it stays stopped and the rest "
            "runs on"
        )

    def _failed(self, item: Supervised, what: str) -> None:
        p = self.policy
        now = self._clock()
        if now - item.started_at >= p.stable_after_s:
            item.failures = 0
        item.failures += 1
        if item.failures >= p.max_fast_failures:
            raise GaveUp(
                f"{item.name} {what}: {item.failures} failures in a row, each within "
                f"{p.stable_after_s:g} s of starting; giving up"
            )
        delay = min(p.backoff_s * 2 ** (item.failures - 1), p.max_backoff_s)
        self._say(
            f"{self._label}: {item.name} {what}; restarting it in {delay:g} s "
            f"(failure {item.failures} in a row; giving up at {p.max_fast_failures})"
        )
        item.restart_at = now + delay

    def _restart(self, item: Supervised) -> None:
        item.restart_at = None
        item.started_at = self._clock()
        try:
            item.restart()
        except Exception as exc:  # whatever stopped it from starting: try again later
            self._failed(item, f"could not be restarted ({exc})")
            return
        item.restarts += 1
        self._say(f"{self._label}: {item.name} restarted")
