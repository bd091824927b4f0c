"""TCP ports for the servers omniqueue starts, reserved so two starters never share one.

Binding port 0 and closing the socket (the usual "free port") races: between the close
and the server's own bind, the kernel may hand the number to anything else, an outgoing
connection included, since ``bind(0)`` and ``connect`` draw from the same
``ip_local_port_range``; and two processes that each pick "a free port" may pick the
same one. CI lost a run to that (issue 33). Here a port is:

- drawn from **outside** the kernel's ephemeral range, so no connection and no port-0
  bind of any process can be handed it;
- **reserved** with a POSIX record lock on byte ``port`` of one lock file shared by every
  process on the machine (``$OMNIQ_PORT_LOCK_FILE``, else ``omniqueue-ports.lock`` in the
  temp directory). The lock is held until the reserving process exits, so the server it
  starts holds the port by then, and a server restarted on the same port finds it still
  unclaimed by other starters;
- checked bindable (with ``SO_REUSEADDR``, as servers bind) before it is handed out.

Within one process a set keeps the reservations (record locks do not conflict with their
own process). A process that cannot open the lock file still gets ports outside the
ephemeral range, unreserved against other processes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

HOST = "127.0.0.1"
_LOWEST = 10000  # below it: well-known services (PostgreSQL, Redis, ...) and `up`'s 8000
_HIGHEST = 65535

# Not the module-level generator: test runners seed that alike in every process.
_random = random.SystemRandom()
_lock = threading.Lock()
_held: set[int] = set()
_file: tuple[int, int] | None = None  # (pid that opened it, fd)


def lock_file_path() -> Path:
    """The machine-wide reservation file."""
    configured = os.environ.get("OMNIQ_PORT_LOCK_FILE")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "omniqueue-ports.lock"


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ``ip_local_port_range`` (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def candidate_ports() -> list[int]:
    """Every port this module may hand out: 10000-65535 less the ephemeral range (the
    whole of 10000-65535 when that range leaves nothing outside it)."""
    low, high = ephemeral_range()
    ports = [p for p in range(_LOWEST, _HIGHEST + 1) if not low <= p <= high]
    return ports or list(range(_LOWEST, _HIGHEST + 1))


def _lock_fd() -> int | None:
    """This process's descriptor on the lock file, opened once per process (a forked child
    holds none of its parent's record locks, so it opens its own). Never closed: closing
    any descriptor of the file would drop all of this process's locks on it."""
    global _file
    if _file is not None and _file[0] == os.getpid():
        return _file[1]
    if _file is not None:  # a fork: the parent's reservations are not ours
        _held.clear()
    try:
        fd = os.open(lock_file_path(), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        _file = None
        return None
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # other users' starters must be able to lock it too
    _file = (os.getpid(), fd)
    return fd


def _try_lock(fd: int | None, port: int) -> bool:
    if fd is None:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _unlock(fd: int | None, port: int) -> None:
    if fd is not None:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, port, os.SEEK_SET)


def bindable(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (with ``SO_REUSEADDR``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _take(fd: int | None, host: str, ports: range) -> bool:
    """Reserve every port of ``ports`` or none of them."""
    taken: list[int] = []
    for port in ports:
        if port in _held or not _try_lock(fd, port):
            break
        taken.append(port)
        if not bindable(host, port):
            break
    else:
        _held.update(taken)
        return True
    for port in taken:
        _unlock(fd, port)
    return False


def reserve_ports(count: int = 1, host: str = HOST) -> int:
    """Reserve ``count`` consecutive ports for this process's lifetime; the first one.

    Raises OSError when no such run is free."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    with _lock:
        fd = _lock_fd()
        pool = candidate_ports()
        allowed = set(pool)
        offset = _random.randrange(len(pool))
        for first in pool[offset:] + pool[:offset]:
            run = range(first, first + count)
            if run[-1] in allowed and all(p in allowed for p in run) and _take(fd, host, run):
                return first
    raise OSError(f"no run of {count} free port(s) left outside the ephemeral range")


def reserve_port_from(start: int, host: str = HOST, skip: frozenset[int] = frozenset()) -> int:
    """Reserve the first port from ``start`` up that is free (a configured base port, such
    as the workers' metrics ports, where an operator expects the numbers in order)."""
    with _lock:
        fd = _lock_fd()
        for port in range(start, _HIGHEST + 1):
            if port not in skip and _take(fd, host, range(port, port + 1)):
                return port
    raise OSError(f"no free port left from {start} up")


def free_port(host: str = HOST) -> int:
    """A TCP port reserved for this process (see the module's docstring)."""
    return reserve_ports(1, host)
