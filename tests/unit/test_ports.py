"""Reserved ports (workers/runtime/ports.py): outside the ephemeral range, never handed out twice,
on the machine or in one process, and bindable when handed out."""

from __future__ import annotations

import multiprocessing
import os
import socket
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from workers.runtime import ports
from workers.runtime.ports import (
    bindable,
    candidate_ports,
    ephemeral_range,
    free_port,
    reserve_port_from,
    reserve_ports,
)

_PER_PROCESS = 150


@pytest.fixture
def lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock file of this test's own, and a process state that starts empty."""
    path = tmp_path / "ports.lock"
    monkeypatch.setenv("OMNIQ_PORT_LOCK_FILE", str(path))
    monkeypatch.setattr(ports, "_file", None)
    monkeypatch.setattr(ports, "_held", set())
    return path


def _reserve_many(path: str, out: multiprocessing.Queue[list[int]], go: Barrier) -> None:
    os.environ["OMNIQ_PORT_LOCK_FILE"] = path
    go.wait()
    out.put([free_port() for _ in range(_PER_PROCESS)])
    go.wait()  # hold the reservations until every process has taken its share


def test_ports_are_outside_the_ephemeral_range(lock_file: Path) -> None:
    low, high = ephemeral_range()
    taken = [free_port() for _ in range(50)]
    assert len(set(taken)) == 50
    assert not [p for p in taken if low <= p <= high]
    assert set(taken) <= set(candidate_ports())
    assert all(bindable("127.0.0.1", p) for p in taken)


def test_two_processes_never_get_the_same_port(lock_file: Path) -> None:
    """Processes that reserve side by side, with the same lock file, share no port; the
    pool is shrunk to 400 ports so collisions would be certain without the locks."""
    context = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[list[int]] = context.Queue()
    go = context.Barrier(3)
    procs = [
        context.Process(target=_reserve_many, args=(str(lock_file), out, go)) for _ in range(2)
    ]
    pool = candidate_ports()[:400]
    original = ports.candidate_ports
    ports.candidate_ports = lambda: pool  # type: ignore[assignment]
    try:
        for proc in procs:
            proc.start()
        go.wait()
        first, second = out.get(timeout=60), out.get(timeout=60)
        mine = [free_port() for _ in range(50)]  # this process, while both hold theirs
        go.wait()
    finally:
        ports.candidate_ports = original  # type: ignore[assignment]
        for proc in procs:
            proc.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    everything = first + second + mine
    assert len(everything) == len(set(everything)) == 2 * _PER_PROCESS + 50
    assert set(everything) <= set(pool)


def test_a_port_another_process_holds_is_skipped(lock_file: Path) -> None:
    """A reservation outlives the reserving call until its process exits, and not after."""
    context = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[list[int]] = context.Queue()
    go = context.Barrier(2)
    proc = context.Process(target=_reserve_many, args=(str(lock_file), out, go))
    proc.start()
    go.wait()
    theirs = set(out.get(timeout=60))
    original = ports.candidate_ports
    ports.candidate_ports = lambda: sorted(theirs)  # type: ignore[assignment]
    try:
        with pytest.raises(OSError, match="no run of 1 free port"):
            free_port()
        go.wait()
        proc.join(timeout=30)
        assert free_port() in theirs  # released with the process
    finally:
        ports.candidate_ports = original  # type: ignore[assignment]


def test_consecutive_ports_are_reserved_together(lock_file: Path) -> None:
    first = reserve_ports(3)
    assert {first, first + 1, first + 2} <= ports._held
    assert all(bindable("127.0.0.1", p) for p in range(first, first + 3))
    with pytest.raises(ValueError, match="count"):
        reserve_ports(0)


def test_a_base_port_scan_skips_busy_and_reserved_ports(lock_file: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        base = busy.getsockname()[1]
        got = reserve_port_from(base, skip=frozenset({base + 1}))
        assert got > base + 1
        assert reserve_port_from(base) not in (base, got)


def test_no_lock_file_still_gives_distinct_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNIQ_PORT_LOCK_FILE", str(tmp_path / "missing" / "ports.lock"))
    monkeypatch.setattr(ports, "_file", None)
    monkeypatch.setattr(ports, "_held", set())
    taken = [free_port() for _ in range(20)]
    assert len(set(taken)) == 20
