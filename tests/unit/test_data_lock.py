"""One ``omniqueue up`` per data directory (:mod:`cli.data_lock`): the lock names its
holder, a refusal writes nothing, and a lock file left by a dead stack blocks nothing.
(Two real ``up`` processes: tests/integration/test_up_options.py.)"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli.data_lock import LOCK_FILE, DataDirInUse, lock_data_dir


def test_the_holder_is_named_and_a_refusal_changes_nothing(tmp_path: Path) -> None:
    held = lock_data_dir(tmp_path, "127.0.0.1", 8000)
    try:
        record = (tmp_path / LOCK_FILE).read_bytes()
        assert json.loads(record) == {"pid": os.getpid(), "host": "127.0.0.1", "port": 8000}
        stat = (tmp_path / LOCK_FILE).stat()
        with pytest.raises(DataDirInUse) as refused:
            lock_data_dir(tmp_path, "127.0.0.1", 9000)
        message = str(refused.value)
        assert str(tmp_path) in message
        assert f"port 8000 (pid {os.getpid()})" in message
        assert (tmp_path / LOCK_FILE).read_bytes() == record
        assert (tmp_path / LOCK_FILE).stat().st_mtime_ns == stat.st_mtime_ns
    finally:
        held.release()
    lock_data_dir(tmp_path, "127.0.0.1", 9000).release()  # free once released


def test_a_lock_file_left_by_a_dead_stack_blocks_nothing(tmp_path: Path) -> None:
    """A process that took the lock and was killed (no clean exit) leaves its record;
    the next one takes the lock all the same and writes its own."""
    child = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from cli.data_lock import lock_data_dir
        lock_data_dir(Path({str(tmp_path)!r}), "127.0.0.1", 8000)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", child], cwd=root, check=False)
    assert done.returncode == -9
    assert json.loads((tmp_path / LOCK_FILE).read_bytes())["port"] == 8000  # stale record
    lock = lock_data_dir(tmp_path, "127.0.0.1", 9000)
    try:
        assert json.loads((tmp_path / LOCK_FILE).read_bytes())["pid"] == os.getpid()
    finally:
        lock.release()


def test_a_holder_that_wrote_no_record_yet_is_still_refused(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_bytes(b"")
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(DataDirInUse, match="in use by another omniqueue up"):
            lock_data_dir(tmp_path, "127.0.0.1", 9000)
    finally:
        os.close(fd)
