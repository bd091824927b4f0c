"""The host's run-ahead of the device, bounded at each cancel point
(``workers/pipelines/run_ahead.py``), on a fake device whose clock is the host's sleeps:
the host waits for the mark ``lookahead`` points back and no other, is never more than
``lookahead`` marks ahead when it goes on, asks the stop question while it waits, and the
denoiser's block gates pace through the same object. On the CPU nothing is paced."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from workers.pipelines.blocks import BlockGate
from workers.pipelines.run_ahead import RunAhead, pace_checkpoint


class Stop(Exception):
    pass


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.index = -1

    def record(self, stream: Any = None) -> None:
        self.index = len(self.device.recorded)
        self.device.recorded.append(self)

    def query(self) -> bool:
        self.device.queried.append(self.index)
        return self.index < self.device.reached


class FakeDevice:
    """A device behind the host: it reaches its next mark once every ``ticks`` sleeps of
    the host (each sleep is a tick of its clock; ``on_tick`` runs at each), at once when
    ``ticks`` is 0, never while ``stalled``."""

    def __init__(self, ticks: int = 1) -> None:
        self.ticks = ticks
        self.stalled = False
        self.on_tick: Callable[[], None] | None = None
        self.recorded: list[FakeEvent] = []
        self.reached = 0  # marks the device has reached (started the work after)
        self.queried: list[int] = []  # the marks the host looked at, in order
        self.slept = 0

    def event(self) -> FakeEvent:
        if self.ticks == 0:
            self.reached = len(self.recorded) + 1  # the device keeps up
        return FakeEvent(self)

    def sleep(self, seconds: float) -> None:
        self.slept += 1
        if self.on_tick is not None:
            self.on_tick()
        if not self.stalled and self.slept % self.ticks == 0:
            self.reached = min(self.reached + 1, len(self.recorded))

    @property
    def ahead(self) -> int:
        """Marks the host has recorded that the device has not reached."""
        return len(self.recorded) - self.reached

    def run_ahead(self, lookahead: int) -> RunAhead:
        return RunAhead(lookahead, event=self.event, sleep=self.sleep)


@pytest.mark.parametrize("lookahead", [1, 2, 3])
def test_the_host_waits_for_the_mark_lookahead_points_back_and_no_further(
    lookahead: int,
) -> None:
    device = FakeDevice(ticks=2)
    pacer = device.run_ahead(lookahead)
    for point in range(12):
        device.queried.clear()
        pacer.pace()
        if point < lookahead:  # nothing to wait for yet
            assert device.queried == [] and device.reached == 0
            continue
        # it looked at the mark lookahead points back only, until the device reached it
        assert set(device.queried) == {point - lookahead}
        assert device.reached == point - lookahead + 1  # and went on at once
        assert device.ahead == lookahead


def test_a_device_that_keeps_up_never_makes_the_host_wait() -> None:
    device = FakeDevice(ticks=0)
    pacer = device.run_ahead(2)
    for _ in range(10):
        pacer.pace()
    assert device.slept == 0


def test_a_stop_asked_while_the_host_waits_ends_the_wait() -> None:
    device = FakeDevice(ticks=5)
    pacer = device.run_ahead(2)
    asked: list[int] = []

    def poll() -> None:
        asked.append(device.slept)
        if len(asked) == 3:
            raise Stop

    pacer.pace(poll)
    pacer.pace(poll)
    assert asked == []  # no wait, no question
    with pytest.raises(Stop):
        pacer.pace(poll)
    assert asked == [0, 1, 2]  # once before each look after the first
    assert device.reached == 0 and len(device.recorded) == 3


def test_clear_forgets_the_marks_of_a_step() -> None:
    device = FakeDevice(ticks=1)
    pacer = device.run_ahead(2)
    for _ in range(3):
        pacer.pace()
    pacer.clear()
    device.queried.clear()
    pacer.pace()
    assert device.queried == []  # nothing before the new step's first mark


def test_the_block_gate_paces_each_block_and_asks_its_reason_while_it_waits() -> None:
    """A gate on a CUDA device paces through its RunAhead (lookahead 2): before block n
    it waits for the device to reach block n - 2, and a stop that arrives meanwhile
    raises before block n runs, naming it."""
    device = FakeDevice(ticks=3)
    gate = BlockGate("cuda")
    gate.run_ahead = device.run_ahead(gate.lookahead)
    assert gate.lookahead == 2
    closed = False

    def reason(block: int) -> BaseException | None:
        return Stop(f"before block {block}") if closed else None

    gate.begin_step()
    for block in range(1, 5):
        gate.enter(reason)
        assert gate.blocks == block and device.ahead <= 2
    # the device stalls in block 3, and the client closes while the host waits
    device.stalled = True

    def close() -> None:
        nonlocal closed
        closed = True

    device.on_tick = close
    device.queried.clear()
    with pytest.raises(Stop, match="before block 5"):
        gate.enter(reason)
    assert device.queried == [2, 2]  # block 3's mark, looked at until the stop came
    gate.lookahead = 1  # a benchmark's setting reaches the pacer
    assert gate.run_ahead.lookahead == 1


def test_a_checkpoint_on_the_cpu_is_not_paced() -> None:
    """No event is made (a CPU build of torch cannot make one) and the stop question is
    left to the checkpoint itself."""

    def check() -> None:
        raise AssertionError("pacing asked the stop question")

    pace_checkpoint((torch.zeros(2), 3), check)
    pace_checkpoint((), check)
