"""The one stop signal of a job run (workers/common/stop_signal.py): sources set it, gates read
it, and a row read that finds the job no longer ours is a source too."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from models.errors import JobLost, WorkerStopping
from storage.bus import BusEntry
from storage.constants import job_events_key
from workers.common.stop_signal import StopSignal
from workers.jobs.shutdown import Shutdown


class Row:
    """The job row as ``JobStore.still_owned`` reads it; counts the reads."""

    def __init__(self) -> None:
        self.ours = True
        self.reads = 0

    def owned(self) -> bool:
        self.reads += 1
        return self.ours


def test_a_source_stops_every_gate_without_a_row_read() -> None:
    row = Row()
    signal = StopSignal(row.owned)
    signal.check()  # ours: goes on
    assert row.reads == 1
    signal.set()  # the bus or the writer thread
    assert signal.is_set() and signal.poll()
    with pytest.raises(JobLost):
        signal.check()
    assert row.reads == 1  # a set signal needs no read


def test_a_row_read_that_finds_the_job_gone_sets_the_signal_for_every_gate() -> None:
    row = Row()
    signal = StopSignal(row.owned)
    assert not signal.is_set()
    row.ours = False  # cancelled or taken over, and the bus entry was lost
    assert signal.poll()
    assert signal.is_set()  # the block gates, which read no row, now see it too
    row.ours = True
    assert signal.poll()  # it stays set


def test_a_gate_with_an_interval_reads_the_row_at_most_that_often() -> None:
    row = Row()
    signal = StopSignal(row.owned)
    for _ in range(100):
        signal.check(min_interval_s=60.0)
    assert row.reads == 1
    signal.check()  # no interval: a read every time
    assert row.reads == 2


def test_without_a_row_reader_only_a_source_sets_it() -> None:
    signal = StopSignal()
    assert not signal.poll()
    signal.set()
    with pytest.raises(JobLost):
        signal.check()


class Stream:
    """A job's event stream as ``EventBus.read`` serves it: each read returns the next
    batch (after blocking on none), and the reads are recorded."""

    def __init__(self, *batches: list[BusEntry]) -> None:
        self.batches = list(batches)
        self.reads: list[tuple[str, str]] = []
        self.drained = threading.Event()

    def read(self, stream: str, after: str, *, block_ms: int | None = None) -> list[BusEntry]:
        self.reads.append((stream, after))
        if not self.batches:
            self.drained.set()
            threading.Event().wait(0.01)
            return []
        return self.batches.pop(0)


def _entry(entry_id: str, **event: Any) -> BusEntry:
    return BusEntry(entry_id, event)


def test_the_bus_watch_sets_it_on_a_cancel_and_stops_reading() -> None:
    progress = _entry("2-0", type="progress", progress=10)
    done = _entry("3-0", type="done", status="failed")
    stream = Stream([progress], [done])
    signal = StopSignal().watch(stream, "video_1", "1-0")  # type: ignore[arg-type]
    for _ in range(500):
        if signal.is_set():
            break
        threading.Event().wait(0.01)
    assert signal.is_set()
    key = job_events_key("video_1")
    assert stream.reads == [(key, "1-0"), (key, "2-0")]  # each read after the last entry
    signal.close()


def test_the_bus_watch_ignores_a_completion_and_ends_with_the_run() -> None:
    stream = Stream([_entry("2-0", type="done", status="completed")])
    signal = StopSignal().watch(stream, "video_1", "1-0")  # type: ignore[arg-type]
    assert stream.drained.wait(5)
    assert not signal.is_set()
    signal.close()
    n = len(stream.reads)
    threading.Event().wait(0.1)
    assert len(stream.reads) <= n + 1  # the watch ends within one read


def test_without_a_bus_or_a_start_entry_nothing_is_watched() -> None:
    stream = Stream()
    StopSignal().watch(None, "video_1", "1-0").close()
    StopSignal().watch(stream, "video_1", None).close()  # type: ignore[arg-type]
    assert stream.reads == []


def test_a_shutdown_stops_the_running_job_as_worker_stopping_after_its_drain() -> None:
    """``Shutdown.request``: at once without a drain, else after it; the gates then raise
    WorkerStopping (the job goes back to the queue), unless a cancel got there first; a
    run that starts after the drain is stopped as it starts."""

    def run() -> Any:
        return SimpleNamespace(stop=StopSignal(), job=SimpleNamespace(id="video_x"))

    now = Shutdown()
    first = run()
    with now.running(first):
        now.request(0)
        assert first.stop.is_set() and first.stop.cause is WorkerStopping
        with pytest.raises(WorkerStopping):
            first.stop.check()
    late = run()
    with now.running(late):  # the drain is over: stopped as it starts
        assert late.stop.cause is WorkerStopping and late.stop.is_set()

    drained = Shutdown()
    cancelled = run()
    with drained.running(cancelled):
        drained.request(0.2)
        assert not cancelled.stop.is_set()  # the drain: it may still finish
        cancelled.stop.set()  # a cancel arrives first
        time.sleep(0.4)
        assert cancelled.stop.cause is JobLost  # the first cause stays
