"""The delivery lane of a world session (``workers/sessions/delivery.py``): chunks leave in
the order they were handed over, while the hand-over returns at once; an error reaches the
device's thread and nothing is sent after it; a full lane says so; closing drops what has
not begun."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from workers.sessions.delivery import ChunkTimes, DeliveryLane


def test_chunks_leave_in_order_while_the_hand_over_returns_at_once() -> None:
    sent: list[int] = []
    release = threading.Event()

    def deliver(i: int) -> None:
        release.wait(5)
        sent.append(i)

    with DeliveryLane("t", depth=3) as lane:
        began = time.monotonic()
        for i in range(3):
            lane.hand_over(functools.partial(deliver, i))
        assert time.monotonic() - began < 1.0 and sent == []  # the device is not kept
        assert lane.full
        release.set()
        lane.drain()
        assert not lane.full
    assert sent == [0, 1, 2]


def test_a_failed_send_reaches_the_device_and_nothing_is_sent_after_it() -> None:
    sent: list[int] = []

    def fail() -> None:
        raise RuntimeError("taken over")

    lane = DeliveryLane("t", depth=4)
    try:
        lane.hand_over(lambda: sent.append(0))
        lane.hand_over(fail)
        lane.hand_over(lambda: sent.append(2))
        with pytest.raises(RuntimeError, match="taken over"):
            lane.drain()
        with pytest.raises(RuntimeError, match="taken over"):
            for _ in range(100):  # check() raises once the failed chunk is settled
                lane.hand_over(lambda: sent.append(3))
    finally:
        lane.close()
    assert sent == [0]


def test_closing_drops_the_chunks_not_begun() -> None:
    sent: list[int] = []
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(5)
        sent.append(0)

    lane = DeliveryLane("t", depth=3)
    lane.hand_over(slow)
    lane.hand_over(lambda: sent.append(1))
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    lane.close()  # waits for the chunk being sent, drops the next
    assert sent == [0]


def test_a_lane_needs_room_for_one_chunk() -> None:
    with pytest.raises(ValueError, match="depth"):
        DeliveryLane("t", depth=0)


def test_chunk_times_sum_per_stage() -> None:
    times = ChunkTimes()
    times.add(0, 1.0, 0.5, 0.01, 0.2, 0.1)
    times.add(1, 3.0, 0.5, 0.03, 0.4, 0.1)
    assert times.chunks == 2
    assert times.totals == pytest.approx(
        {"denoise": 4.0, "decode": 1.0, "capture": 0.04, "encode": 0.6, "send": 0.2}
    )
