"""The restart policy of ``omniqueue up`` (:mod:`workers.runtime.supervisor`) on a fake
clock; the real processes are supervised in ``tests/integration/test_up_supervision.py``."""

from __future__ import annotations

import pytest

from workers.runtime.supervisor import GaveUp, RestartPolicy, Supervisor


class Child:
    def __init__(self) -> None:
        self.code: int | None = None
        self.starts = 0
        self.fail_start = False

    def exit_code(self) -> int | None:
        return self.code

    def restart(self) -> None:
        self.starts += 1
        if self.fail_start:
            raise RuntimeError("port taken")
        self.code = None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _supervisor(policy: RestartPolicy) -> tuple[Supervisor, Child, Clock, list[str]]:
    clock, child, said = Clock(), Child(), []
    sup = Supervisor(said.append, policy, clock)
    sup.add("worker 0", child.exit_code, child.restart)
    return sup, child, clock, said


def test_a_dead_child_is_restarted_after_a_growing_backoff() -> None:
    sup, child, clock, said = _supervisor(RestartPolicy(backoff_s=1, max_backoff_s=3))
    delays = []
    for _ in range(3):
        clock.now += 0.5
        child.code = -9
        sup.check()  # noticed: restart scheduled, not yet done
        assert child.starts == len(delays)
        start = clock.now
        while child.starts == len(delays):
            clock.now += 0.25
            sup.check()
        delays.append(clock.now - start)
    assert delays == [1.0, 2.0, 3.0]  # 1, 2, then capped at max_backoff_s
    assert "worker 0 exited with code -9; restarting it in 1 s" in said[0]
    assert said[1] == "omniqueue up: worker 0 restarted"


def test_it_gives_up_after_repeated_fast_failures_naming_the_child() -> None:
    sup, child, clock, said = _supervisor(RestartPolicy(backoff_s=1, max_fast_failures=3))
    child.fail_start = True
    child.code = 1
    with pytest.raises(GaveUp, match=r"worker 0 could not be restarted \(port taken\)"):
        for _ in range(20):
            sup.check()
            clock.now += 1
    assert child.starts == 2  # the first death, then two failed restarts: the third failure
    assert "worker 0 exited with code 1; restarting it in 1 s" in said[0]
    assert "worker 0 could not be restarted (port taken); restarting it in 2 s" in said[1]


def test_a_child_that_ran_long_enough_starts_a_fresh_count() -> None:
    sup, child, clock, _ = _supervisor(
        RestartPolicy(backoff_s=1, stable_after_s=10, max_fast_failures=2)
    )
    for _ in range(5):  # dies every 30 s: never fast, never gives up
        clock.now += 30
        child.code = -9
        sup.check()
        clock.now += 1
        sup.check()
        assert child.code is None
    assert child.starts == 5


def test_a_configuration_error_is_said_once_and_not_restarted_while_the_rest_runs() -> None:
    """A child that exits with CONFIG_ERROR said why itself (a registry with no model for
    it): restarting it would only repeat that, so it stays stopped, said once, and the
    others are still supervised."""
    from workers.runtime.supervisor import CONFIG_ERROR

    sup, child, clock, said = _supervisor(RestartPolicy(backoff_s=1, max_fast_failures=2))
    other = Child()
    sup.add("api", other.exit_code, other.restart)
    child.code = CONFIG_ERROR
    for _ in range(10):
        sup.check()
        clock.now += 1
    assert child.starts == 0
    assert said == [
        "omniqueue up: worker 0 stopped on a configuration error (exit code 78; its reason is "
        "above); a restart cannot fix it, so it stays stopped and the rest runs on"
    ]
    other.code = -9
    sup.check()
    clock.now += 1
    sup.check()
    assert other.starts == 1  # still supervised


def test_a_child_stopped_on_purpose_is_started_again_at_once_and_counts_no_failure() -> None:
    """Exit code 0 is a child that was sent SIGTERM alone (a worker puts its job back, then
    exits 0): restarted in the same tick, however often, with no backoff and no give-up.
    An exit 0 right after a start is a fault like any other."""
    sup, child, clock, said = _supervisor(
        RestartPolicy(backoff_s=1, min_run_s=1, max_fast_failures=2)
    )
    for round_ in range(5):
        clock.now += 2
        child.code = 0
        sup.check()
        assert child.starts == round_ + 1 and child.code is None
    assert said[:2] == [
        "omniqueue up: worker 0 stopped (exit code 0: it was told to stop); starting it again",
        "omniqueue up: worker 0 restarted",
    ]
    clock.now += 0.5  # exits 0 half a second after its start
    child.code = 0
    sup.check()
    assert child.starts == 5
    assert "worker 0 exited with code 0; restarting it in 1 s" in said[-1]
