"""The one stop signal of a job run (workers/stop_signal.py): sources set it, gates read
it, and a row read that finds the job no longer ours is a source too."""

from __future__ import annotations

import pytest

from models.errors import JobLost
from workers.stop_signal import StopSignal


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
