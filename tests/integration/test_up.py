"""``omniqueue up``: one command runs everything, stops everything, and keeps its data."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cli.embedded import free_port
from tests.integration.stack import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _descendants(pid: int) -> set[int]:
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


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _listening_ports(pids: set[int]) -> set[int]:
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


def _port_free(port: int) -> bool:
    """Nothing listens on ``port`` (a server could bind it again, SO_REUSEADDR as usual)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Up:
    def __init__(self, data_dir: Path, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIQ_")}
        env["PYTHONPATH"] = str(REPO)
        self.log = data_dir.parent / f"up-{port}.log"
        self.port = port
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "up", "--port", str(port),
                 "--data-dir", str(data_dir), "--workers", "1"],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert f"http://127.0.0.1:{port}" in line, self.log.read_text()[-4000:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int) -> tuple[int, set[int], set[int]]:
        tree = _descendants(self.proc.pid)
        ports = _listening_ports(tree)
        self.proc.send_signal(sig)
        code = self.proc.wait(60)
        return code, tree, ports


def test_up_runs_stops_cleanly_and_keeps_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    up = Up(data_dir, port)
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            assert c.get("/ready").status_code == 200
            video = c.post("/v1/videos", json={
                "prompt": "a green kite", "size": "64x48", "seconds": "0.5",
                "num_inference_steps": 3,
            }).json()
            deadline = time.monotonic() + 120
            while c.get(f"/v1/videos/{video['id']}").json()["status"] != "completed":
                assert time.monotonic() < deadline, up.log.read_text()[-4000:]
                time.sleep(0.2)
            first = c.get(f"/v1/videos/{video['id']}/content").content
    finally:
        code, tree, ports = up.stop(signal.SIGTERM)
    assert code == 0
    assert len(tree) >= 4  # valkey, weed, api, worker (at least)
    assert port in ports and len(ports) >= 3
    leftovers = [pid for pid in tree if _alive(pid)]
    assert leftovers == [], "orphan processes after SIGTERM"
    assert [p for p in ports if not _port_free(p)] == []
    assert (data_dir / "omniqueue.db").exists()

    again = Up(data_dir, port)
    try:
        with httpx.Client(base_url=again.url, timeout=30) as c:
            kept = c.get(f"/v1/videos/{video['id']}").json()
            assert kept["status"] == "completed"
            assert c.get(f"/v1/videos/{video['id']}/content").content == first
    finally:
        code, tree, _ = again.stop(signal.SIGINT)
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []
