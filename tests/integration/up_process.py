"""``omniqueue up`` as the tests of ``test_up_*.py`` run it: :class:`Up` starts one on a
data directory and a port and reads its "is up" line; the rest reads its process tree
from /proc (what runs below it, which ports they listen on) and waits on its jobs."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.integration.stack import REPO


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def listening_ports(pids: set[int]) -> set[int]:
    """TCP ports in LISTEN state owned by any of ``pids`` (sockets by inode)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` (a server could bind it again, SO_REUSEADDR as usual)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def up_command(port: int, data_dir: Path, *args: str) -> list[str]:
    """``omniqueue up`` on ``port`` with ``data_dir``, as a subprocess' argv."""
    return [
        sys.executable, "-m", "cli.main", "up", "--port", str(port), "--data-dir", str(data_dir),
        *args,
    ]  # fmt: skip


class Up:
    def __init__(
        self,
        data_dir: Path,
        port: int,
        extra_env: dict[str, str] | None = None,
        workers: int = 1,
        args: tuple[str, ...] = (),
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIQ_")}
        env["PYTHONPATH"] = str(REPO)
        env.update(extra_env or {})
        self.log = data_dir.parent / f"up-{port}.log"
        self.port = port
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                up_command(port, data_dir, "--workers", str(workers), *args),
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().decode()
        assert f"http://127.0.0.1:{port}" in self.line, self.log.read_text()[-4000:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int) -> tuple[int, set[int], set[int]]:
        tree = descendants(self.proc.pid)
        ports = listening_ports(tree)
        self.proc.send_signal(sig)
        code = self.proc.wait(60)
        return code, tree, ports

    def child(self, *words: str) -> int:
        """The pid of the one process below ``up`` whose command line has all ``words``."""
        found = [pid for pid in descendants(self.proc.pid) if has_words(pid, words)]
        assert len(found) == 1, (words, found)
        return found[0]


def has_words(pid: int, words: tuple[str, ...]) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return False
    return all(word in argv for word in words)


def said_ready(up: Up, *workers: str) -> bool:
    """Celery's ``<worker>@<host> ready.`` line of each worker is in up's log."""
    log = up.log.read_text()
    return all(re.search(rf"{w}@\S+ ready\.", log) for w in workers)


def wait_for(predicate: Any, what: str, up: Up, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}:\n" + up.log.read_text()[-6000:]
        time.sleep(0.2)


def video_status(c: httpx.Client, video_id: str) -> dict[str, Any]:
    resp = c.get(f"/v1/videos/{video_id}")
    assert resp.status_code == 200, resp.text  # the API never goes away
    body: dict[str, Any] = resp.json()
    return body


SMALL_JOB = {"prompt": "a red kite", "size": "64x48", "seconds": "0.5", "num_inference_steps": 3}


def api_pids(up: Up) -> list[int]:
    return [pid for pid in descendants(up.proc.pid) if has_words(pid, ("cli.main", "api"))]
