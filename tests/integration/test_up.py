"""``omniqueue up``: one command runs everything, stops everything, and keeps its data."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from storage.constants import job_events_key, presence_key
from tests.integration.conftest import REDIS_BASE_URL
from tests.integration.stack import REPO
from workers.runtime.ports import free_port, reserve_ports

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
                [sys.executable, "-m", "cli.main", "up", "--port", str(port),
                 "--data-dir", str(data_dir), "--workers", str(workers), *args],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
            )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().decode()
        assert f"http://127.0.0.1:{port}" in self.line, self.log.read_text()[-4000:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int) -> tuple[int, set[int], set[int]]:
        tree = _descendants(self.proc.pid)
        ports = _listening_ports(tree)
        self.proc.send_signal(sig)
        code = self.proc.wait(60)
        return code, tree, ports

    def child(self, *words: str) -> int:
        """The pid of the one process below ``up`` whose command line has all ``words``."""
        found = [pid for pid in _descendants(self.proc.pid) if _has_words(pid, words)]
        assert len(found) == 1, (words, found)
        return found[0]


def _has_words(pid: int, words: tuple[str, ...]) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return False
    return all(word in argv for word in words)


def _said_ready(up: Up, *workers: str) -> bool:
    """Celery's ``<worker>@<host> ready.`` line of each worker is in up's log."""
    log = up.log.read_text()
    return all(re.search(rf"{w}@\S+ ready\.", log) for w in workers)


def test_up_runs_stops_cleanly_and_keeps_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    up = Up(data_dir, port)
    # "is up" once the workers take jobs (it came seconds before them): Celery says its
    # "ready." just after the signal that writes the status file up waits on
    deadline = time.monotonic() + 1
    while not _said_ready(up, "embedded-0", "embedded-rt"):
        assert time.monotonic() < deadline, up.log.read_text()[-4000:]
        time.sleep(0.05)
    assert re.search(r"embedded-0@\S+ ready\.", (data_dir / "logs" / "worker-0.log").read_text())
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
    log = up.log.read_text()
    # quiet: no Alembic line per revision, no Celery banner against root (the suite runs
    # as root here), no line per /health poll
    assert "INFO alembic" not in log and "Running upgrade" not in log, log[:4000]
    assert "superuser privileges" not in log and "HTTP Request:" not in log, log[:4000]

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


def _wait(predicate: Any, what: str, up: Up, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}:\n" + up.log.read_text()[-6000:]
        time.sleep(0.2)


def _status(c: httpx.Client, video_id: str) -> dict[str, Any]:
    resp = c.get(f"/v1/videos/{video_id}")
    assert resp.status_code == 200, resp.text  # the API never goes away
    body: dict[str, Any] = resp.json()
    return body


SMALL_JOB = {"prompt": "a red kite", "size": "64x48", "seconds": "0.5", "num_inference_steps": 3}


def test_ctrl_c_with_a_job_running_puts_it_back_and_the_next_up_runs_it(tmp_path: Path) -> None:
    """Ctrl-C of ``up`` mid-job: the worker puts the job back (``queued`` in the database
    once ``up`` has exited, not a stale ``in_progress``) instead of being killed after the
    grace; the next ``up`` runs it to the end at once, as attempt 2."""
    import sqlite3

    data_dir = tmp_path / "data"
    port = free_port()
    points = tmp_path / "failpoints.json"
    points.write_text(json.dumps({"step:1@attempt1": "pause"}))
    up = Up(data_dir, port, {"OMNIQ_WORKER__FAILPOINTS_FILE": str(points)})
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()
            _wait(lambda: _status(c, video["id"])["status"] == "in_progress", "running", up)
            _wait(lambda: "failpoint step:1@attempt1: pause" in up.log.read_text(), "paused", up)
    finally:
        code, _, _ = up.stop(signal.SIGINT)
    assert code == 0
    log = up.log.read_text()
    assert f"job {video['id']}: released" in log and "did not stop within" not in log, log[-4000:]
    with sqlite3.connect(data_dir / "omniqueue.db") as db:
        row = db.execute("SELECT status, worker_id FROM jobs WHERE id = ?", (video["id"],))
        assert row.fetchone() == ("queued", None)
    points.write_text("{}")
    again = Up(data_dir, port, {"OMNIQ_WORKER__FAILPOINTS_FILE": str(points)})
    try:
        with httpx.Client(base_url=again.url, timeout=30) as c:
            _wait(lambda: _status(c, video["id"])["status"] == "completed", "completed", again)
            assert _status(c, video["id"])["attempt"] == 2
    finally:
        code, _, _ = again.stop(signal.SIGTERM)
    assert code == 0


def test_a_killed_worker_is_restarted_and_its_job_taken_over(tmp_path: Path) -> None:
    failpoints = tmp_path / "failpoints.json"
    failpoints.write_text(json.dumps({"step:1@attempt1": "pause"}))
    env = {
        "OMNIQ_WORKER__FAILPOINTS_FILE": str(failpoints),
        "OMNIQ_WORKER__HEARTBEAT_S": "0.5",
        "OMNIQ_WORKER__HEARTBEAT_TIMEOUT_S": "3",
        "OMNIQ_WORKER__RECONCILE_INTERVAL_S": "1",
    }
    up = Up(tmp_path / "data", free_port(), env)
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            before = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            _wait(lambda: _status(c, before)["status"] == "in_progress", "never started", up)
            worker = up.child("worker", "embedded-0")
            os.kill(worker, signal.SIGKILL)
            failpoints.write_text("{}")  # the takeover (attempt 2) and later jobs run through
            after = c.post("/v1/videos", json={**SMALL_JOB, "prompt": "after"}).json()["id"]
            for video_id in (before, after):
                _wait(lambda v=video_id: _status(c, v)["status"] == "completed", video_id, up)
            assert _status(c, before)["attempt"] == 2  # taken over by the restarted worker
            assert c.get("/ready").status_code == 200
            assert up.child("worker", "embedded-0") != worker
        log = up.log.read_text()
        assert "worker 0 exited with code -9; restarting it in" in log
        assert "omniqueue up: worker 0 restarted" in log
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []


def test_killed_valkey_and_seaweedfs_are_restarted(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", free_port())
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            assert c.get("/ready").status_code == 200
            api = up.child("api")
            valkey = next(pid for pid in _descendants(up.proc.pid) if _has_valkey(pid))
            weed = up.child("server", "-s3")
            os.kill(valkey, signal.SIGKILL)
            os.kill(weed, signal.SIGKILL)
            _wait(lambda: "valkey restarted" in up.log.read_text(), "valkey not restarted", up)
            _wait(lambda: "(SeaweedFS) restarted" in up.log.read_text(), "weed not back", up)
            _wait(lambda: c.get("/ready").status_code == 200, "/ready not back to 200", up)
            assert up.child("api") == api  # the API never went away
            assert up.child("server", "-s3") != weed
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            _wait(lambda: _status(c, video)["status"] == "completed", "no job after restart", up)
            assert c.get(f"/v1/videos/{video}/content").status_code == 200
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []


def _has_valkey(pid: int) -> bool:
    try:
        return "valkey-server" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    except OSError:
        return False


def test_stop_with_an_open_sse_stream_lets_the_api_exit_gracefully(tmp_path: Path) -> None:
    # No job worker: the job stays queued, so its event stream stays open.
    up = Up(tmp_path / "data", free_port(), workers=0)
    stream_ended = threading.Event()
    opened = threading.Event()
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            api = up.child("api")

            def follow() -> None:
                try:
                    with c.stream("GET", f"/v1/videos/{video}/events") as resp:
                        assert resp.status_code == 200
                        for _ in resp.iter_raw():
                            opened.set()
                except httpx.HTTPError:
                    pass
                stream_ended.set()

            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            assert opened.wait(30), up.log.read_text()[-4000:]
            started = time.monotonic()
            code, tree, _ = up.stop(signal.SIGTERM)
            took = time.monotonic() - started
            reader.join(5)
    finally:
        if up.proc.poll() is None:
            up.stop(signal.SIGKILL)
    log = up.log.read_text()
    assert code == 0
    assert stream_ended.is_set()
    assert "api did not stop" not in log, log[-4000:]  # not SIGKILLed...
    assert f"Finished server process [{api}]" in log  # ...uvicorn finished its shutdown
    assert took < 10 + 5  # the child stop timeout, plus valkey's and weed's own stop
    assert [pid for pid in tree if _alive(pid)] == []


def _api_pids(up: Up) -> list[int]:
    return [pid for pid in _descendants(up.proc.pid) if _has_words(pid, ("cli.main", "api"))]


def test_api_processes_share_the_port_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", free_port(), args=("--api-processes", "2"))
    try:
        apis = _api_pids(up)
        assert len(apis) == 2, apis
        # up is "up" once one of them answers /health; the other may still be starting
        _wait(
            lambda: all(up.port in _listening_ports({pid}) for pid in apis),
            "both API processes listen on the port",
            up,
            timeout=60,
        )
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            _wait(lambda: _status(c, video)["status"] == "completed", "never completed", up)
        os.kill(apis[0], signal.SIGKILL)
        # Until the killed process has exited, its listening socket still takes a share
        # of new connections and resets them when it closes (seen once in 30 runs).
        _wait(lambda: not _alive(apis[0]), "the killed API process exited", up, timeout=30)
        for _ in range(20):  # a new connection each time: the other process answers
            resp = httpx.get(f"{up.url}/v1/videos/{video}", timeout=30)
            assert resp.status_code == 200 and resp.json()["status"] == "completed"
        _wait(lambda: len(_api_pids(up)) == 2, "the dead API process was not replaced", up)
        assert len(set(_api_pids(up)) - set(apis)) == 1
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []


def _sse_ids_and_types(text: str) -> list[tuple[str, str]]:
    """``(id, event type)`` of each SSE event in ``text``."""
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            out.append((fields["id"], fields.get("event", "")))
    return out


def test_api_replicas_listen_on_consecutive_ports_and_serve_the_same_jobs(
    tmp_path: Path,
) -> None:
    port = reserve_ports(2)
    up = Up(tmp_path / "data", port, args=("--api-replicas", "2"))
    a, b = up.url, f"http://127.0.0.1:{port + 1}"
    try:
        apis = _api_pids(up)
        assert len(apis) == 2, apis
        assert {p for pid in apis for p in _listening_ports({pid})} == {port, port + 1}
        with httpx.Client(base_url=a, timeout=30) as ca, httpx.Client(base_url=b, timeout=30) as cb:
            assert ca.get("/ready").status_code == 200 and cb.get("/ready").status_code == 200
            video = ca.post("/v1/videos", json=SMALL_JOB).json()["id"]  # created on A
            _wait(lambda: _status(cb, video)["status"] == "completed", "never completed", up)
            assert ca.get(f"/v1/videos/{video}").json() == cb.get(f"/v1/videos/{video}").json()
            content = ca.get(f"/v1/videos/{video}/content").content
            assert len(content) > 0 and cb.get(f"/v1/videos/{video}/content").content == content
            # An SSE watcher moves from A to B with Last-Event-ID and misses nothing.
            everything = _sse_ids_and_types(ca.get(f"/v1/videos/{video}/events").text)
            assert everything[-1][1] == "done", everything
            cut = len(everything) // 2
            rest = cb.get(
                f"/v1/videos/{video}/events", headers={"Last-Event-ID": everything[cut - 1][0]}
            )
            assert _sse_ids_and_types(rest.text) == everything[cut:]
            assert [v["id"] for v in cb.get("/v1/videos").json()["data"]] == [video]
    finally:
        code, tree, ports = up.stop(signal.SIGTERM)
    assert code == 0
    assert {port, port + 1} <= ports
    assert [pid for pid in tree if _alive(pid)] == []


def test_redis_url_runs_the_stack_on_that_redis_without_valkey(
    tmp_path: Path, redis_db: int
) -> None:
    url = f"{REDIS_BASE_URL}/{redis_db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    up = Up(tmp_path / "data", free_port(), args=("--redis-url", url))
    try:
        valkeys = [pid for pid in _descendants(up.proc.pid) if _has_words(pid, ("valkey",))]
        assert valkeys == []
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            _wait(lambda: _status(c, video)["status"] == "completed", "never completed", up)
        # the broker, the job's events and the worker's presence are on that Redis
        assert client.exists(job_events_key(video))
        assert client.zcard(presence_key("reference/video")) == 1
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
        client.flushdb()
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []


def test_a_registry_without_streaming_models_runs_without_realtime_workers(
    tmp_path: Path,
) -> None:
    """The README's "serve one model" recipe: ``up`` says once that no realtime worker
    starts and stays up (before, the realtime worker exited, was restarted five times and
    took the stack down); jobs run; each realtime endpoint refuses a session naming the
    kind of model the server lacks."""
    from websockets.sync.client import connect

    up = Up(tmp_path / "data", free_port(), extra_env={"OMNIQ_MODELS": "reference/video"})
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            _wait(lambda: _status(c, video)["status"] == "completed", "never completed", up)
        ws_url = up.url.replace("http://", "ws://")
        with connect(f"{ws_url}/v1/realtime/video") as ws:
            ws.send(json.dumps({"type": "session.start", "prompt": "a lake"}))
            error = json.loads(ws.recv(timeout=10))
        assert (error["code"], error["param"]) == ("model_not_found", "model"), error
        assert "serves no world model" in error["message"]
        with connect(f"{ws_url}/v1/realtime") as ws:
            event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["error"]["param"] == "model", event
        assert "serves no realtime voice model" in event["error"]["message"]
        assert not [p for p in _descendants(up.proc.pid) if _has_words(p, ("--realtime",))]
        assert up.proc.poll() is None  # still up
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    log = up.log.read_text()
    assert log.count("no streaming model is served, so no realtime worker starts") == 1, log
    assert "giving up" not in log and "exited with code" not in log
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []


def _tree_digest(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under ``root``: (size, mtime in ns, SHA-256 of a file)."""
    import hashlib

    out = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns, digest)
    return out


def test_a_second_up_on_a_data_directory_in_use_exits_2_and_touches_nothing(
    tmp_path: Path,
) -> None:
    """The README's "another port" tip without ``--data-dir``: a second ``up`` on the
    directory of a running stack stops at once (exit 2), naming the directory and the
    running stack's port and pid, and writes nothing there. The first stack is frozen
    (SIGSTOP) meanwhile, so that any change to the tree is the second one's."""
    data_dir = tmp_path / "data"
    port = free_port()
    up = Up(data_dir, port)
    try:
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            _wait(lambda: _status(c, video)["status"] == "completed", "never completed", up)
        frozen = [up.proc.pid, *_descendants(up.proc.pid)]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            before = _tree_digest(data_dir)
            env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIQ_")}
            second = subprocess.run(
                [sys.executable, "-m", "cli.main", "up", "--port", str(free_port()),
                 "--data-dir", str(data_dir)],
                cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True,
                text=True, timeout=60,
            )  # fmt: skip
            after = _tree_digest(data_dir)
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stdout == ""
        refusal = second.stderr.strip().splitlines()[-1]
        assert str(data_dir) in refusal and f"port {port} (pid {up.proc.pid})" in refusal
        assert after == before
        with httpx.Client(base_url=up.url, timeout=30) as c:  # the first one runs on
            _wait(lambda: c.get("/ready").status_code == 200, "/ready after SIGCONT", up)
            assert _status(c, video)["status"] == "completed"
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []


def test_a_model_that_cannot_load_is_named_and_the_rest_runs_on(tmp_path: Path) -> None:
    """A registry whose one model cannot load: its worker exits 78 (not restarted). up
    says which worker, which model, why and where the log is, before it says it is up,
    and runs on; /health and /ready name the model alike (/health said {} before), and a
    create for it is refused."""
    registry = tmp_path / "models.toml"
    registry.write_text(
        '[[model]]\nname = "Wan-AI/Wan2.1-T2V-1.3B"\nadapter = "diffusers.wan"\n'
        'path = "/nonexistent/wan"\n'
    )
    data_dir = tmp_path / "data"
    up = Up(data_dir, free_port(), extra_env={"OMNIQ_MODEL_REGISTRY": str(registry)})
    try:
        log = up.log.read_text()  # all of this before the "is up" line
        assert up.line.rstrip().endswith("; stopped: worker 0 (embedded-0) (see above)")
        reason = "path /nonexistent/wan does not exist"
        assert (
            f"worker 0 (embedded-0) could not load 'Wan-AI/Wan2.1-T2V-1.3B': {reason}. "
            "It exited with code 78" in log
        ), log[-4000:]
        assert f"Its log: {data_dir / 'logs' / 'worker-0.log'}" in log
        assert reason in (data_dir / "logs" / "worker-0.log").read_text()
        with httpx.Client(base_url=up.url, timeout=30) as c:
            expected = {"Wan-AI/Wan2.1-T2V-1.3B": reason}
            _wait(lambda: c.get("/ready").json()["unavailable_models"] == expected, "/ready", up)
            assert c.get("/health").json()["unavailable_models"] == expected
            refused = c.post("/v1/videos", json={"prompt": "a fox"})
            assert refused.status_code == 503 and reason in refused.text, refused.text
        assert up.proc.poll() is None  # still up
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    log = up.log.read_text()
    assert "giving up" not in log and log.count("It exited with code 78") == 1
    assert code == 0
    assert [pid for pid in tree if _alive(pid)] == []
