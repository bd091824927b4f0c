"""The host's run-ahead of the device, bounded at each cancel point
(``workers/pipelines/run_ahead.py``), on a fake device whose clock is the host's sleeps:
the host waits for the mark ``lookahead`` points back and no other, is never more than
``lookahead`` marks ahead when it goes on, asks the stop question while it waits, and the
denoiser's block gates pace through the same object. On the CPU nothing is paced. The
cancel points' lookahead is ``OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD``: it reaches the pacer
of each thread, and 0 does not pace at all."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from storage.settings import Settings
from workers.pipelines import run_ahead
from workers.pipelines.blocks import BlockGate
from workers.pipelines.run_ahead import (
    CHECKPOINT_LOOKAHEAD,
    RunAhead,
    checkpoint_pacer,
    configure_checkpoints,
    pace_checkpoint,
)


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


def _paced_in_a_new_thread(device: FakeDevice, points: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run ``points`` cancel points on a new thread, as a worker's session thread does
    (its pacer made at its first point, on ``device``; the points' tensors taken for
    CUDA ones); return that pacer's lookahead."""
    monkeypatch.setattr(run_ahead, "_stream_of", lambda args: "stream")
    monkeypatch.setattr(run_ahead, "RunAhead", lambda n: device.run_ahead(n))
    seen: list[int] = []

    def go() -> None:
        for _ in range(points):
            pace_checkpoint((torch.zeros(1),), lambda: None)
        seen.append(checkpoint_pacer().lookahead)

    thread = threading.Thread(target=go)
    thread.start()
    thread.join()
    return seen[0]


def test_the_checkpoint_lookahead_setting_reaches_each_thread_s_pacer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default is the measured one; the setting, applied at the worker's start, is the
    lookahead of the pacers made after, and bounds how far ahead their host goes."""
    assert Settings().worker.checkpoint_lookahead == CHECKPOINT_LOOKAHEAD
    monkeypatch.setenv("OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD", "1")
    try:
        configure_checkpoints(Settings().worker.checkpoint_lookahead)
        device = FakeDevice(ticks=3)
        assert _paced_in_a_new_thread(device, 6, monkeypatch) == 1
        assert device.ahead <= 1 and device.slept > 0  # it waited, one mark back
    finally:
        configure_checkpoints(CHECKPOINT_LOOKAHEAD)


def test_a_checkpoint_lookahead_of_0_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """0: no mark is recorded, none looked at, no sleep, however far behind the device
    is (it never moves here); the host queues freely."""
    monkeypatch.setenv("OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD", "0")
    try:
        configure_checkpoints(Settings().worker.checkpoint_lookahead)
        device = FakeDevice()
        device.stalled = True
        assert _paced_in_a_new_thread(device, 50, monkeypatch) == 0
        assert (device.recorded, device.queried, device.slept) == ([], [], 0)
    finally:
        configure_checkpoints(CHECKPOINT_LOOKAHEAD)


def test_a_negative_checkpoint_lookahead_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIQ_WORKER__CHECKPOINT_LOOKAHEAD", "-1")
    with pytest.raises(ValueError, match="checkpoint_lookahead"):
        Settings()
