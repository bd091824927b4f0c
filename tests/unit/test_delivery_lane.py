"""The delivery lane of a world session (``workers/sessions/delivery.py``): chunks leave in
the order they were handed over, while the hand-over returns at once; an error reaches the
device's thread and nothing is sent after it; a full lane says so; closing drops what has
not begun; a chunk handed over as a stream is taken piece by piece as it is made, and one
abandoned (or still open at the close) sends nothing."""

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


def test_a_streamed_chunk_is_taken_piece_by_piece_before_it_is_whole() -> None:
    """The lane takes each piece as it is put, before the chunk's end is known; the
    end's delivery follows the last piece, and the chunk after it waits its turn."""
    taken: list[str] = []
    first_taken = threading.Event()

    def take(piece: str) -> None:
        taken.append(piece)
        first_taken.set()

    with DeliveryLane("t", depth=2) as lane:
        stream = lane.stream(take)
        stream.put("a")
        assert first_taken.wait(5)  # taken while the chunk is still being made
        assert taken == ["a"]
        stream.put("b")
        stream.end(lambda: taken.append("sent 0"))
        lane.hand_over(lambda: taken.append("sent 1"))
        lane.drain()
    assert taken == ["a", "b", "sent 0", "sent 1"]


def test_an_abandoned_stream_sends_nothing_and_a_closing_lane_abandons_an_open_one() -> None:
    sent: list[str] = []
    lane = DeliveryLane("t", depth=2)
    try:
        stream = lane.stream(sent.append)
        stream.put("piece")
        stream.abandon()  # a stop inside the decode
        stream.abandon()  # once is enough
        with pytest.raises(RuntimeError, match="closed"):
            stream.end(lambda: sent.append("sent"))
        lane.drain()
        assert sent == ["piece"]
        open_one = lane.stream(sent.append)
        with pytest.raises(RuntimeError, match="still open"):
            lane.stream(sent.append)
        open_one.put("another")
    finally:
        began = time.monotonic()
        lane.close()  # the open stream's turn waits for no more pieces
    assert time.monotonic() - began < 5.0
    assert "sent" not in sent


def test_chunk_times_sum_per_stage() -> None:
    times = ChunkTimes()
    stages = dict.fromkeys(ChunkTimes.STAGES, 0.1) | {"denoise": 1.0, "tail": 0.05}
    times.add(0, stages)
    times.add(1, stages | {"denoise": 3.0})
    assert times.chunks == 2
    assert times.totals == pytest.approx(
        dict.fromkeys(ChunkTimes.STAGES, 0.2) | {"denoise": 4.0, "tail": 0.1}
    )
    with pytest.raises(ValueError, match="times are"):
        times.add(2, {"denoise": 1.0})
