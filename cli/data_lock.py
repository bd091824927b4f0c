"""One ``omniqueue up`` per data directory.

Two stacks on one data directory damage each other's files: a second Valkey loads the
same append-only files and, on exit, saves its RDB over the first one's; a second
SeaweedFS cannot open the filer's LevelDB and dies. So ``up`` takes an exclusive
``flock`` on ``<data dir>/omniqueue.lock`` before it writes anything there and holds it
for the stack's life; a second ``up`` finds it held and stops at once, naming the
running stack from what the holder wrote in the file (its API's address and its pid).

The kernel drops the lock when its holder exits, however it exits: a file left behind
by a crash (or a ``kill -9``) blocks nothing; only the lock counts, never the pid in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

LOCK_FILE = "omniqueue.lock"


class DataDirInUse(Exception):
    """Another live ``omniqueue up`` holds the data directory; the message says which."""


class DataDirLock:
    """The held lock of a data directory (:func:`lock_data_dir`); :meth:`release` it."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Drop the lock (closing the file does); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def lock_data_dir(data_dir: Path, host: str, port: int) -> DataDirLock:
    """Hold ``data_dir``'s lock for this process, with its ``host``, ``port`` and pid
    written in the lock file; :class:`DataDirInUse` when a live process holds it. A
    refusal writes nothing (the lock file exists already then: its holder made it)."""
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0)
        os.close(fd)
        raise DataDirInUse(_in_use(data_dir, holder)) from None
    except BaseException:
        os.close(fd)
        raise
    record = json.dumps({"pid": os.getpid(), "host": host, "port": port}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record + b"\n", 0)
    return DataDirLock(fd, path)


def _in_use(data_dir: Path, holder: bytes) -> str:
    """The refusal: the directory, and the running stack's address and pid when its
    record can be read (it cannot in the instant between its lock and its write)."""
    who = "another omniqueue up"
    with contextlib.suppress(ValueError, TypeError, KeyError):
        record = json.loads(holder)
        who = f"the omniqueue up on port {int(record['port'])} (pid {int(record['pid'])})"
    return (
        f"the data directory {data_dir} is in use by {who}: stop that one first, or give "
        "this one a directory of its own (--data-dir DIR); two stacks on one directory "
        "would damage each other's files"
    )
