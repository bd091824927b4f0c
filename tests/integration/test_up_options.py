"""``omniqueue up``'s options and configurations: API replicas on consecutive ports,
``--redis-url``, a registry without streaming models or with a model that cannot load,
and a second ``up`` on a data directory in use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from storage.constants import job_events_key, presence_key
from tests.integration.conftest import REDIS_BASE_URL
from tests.integration.stack import REPO
from tests.integration.up_process import (
    SMALL_JOB,
    Up,
    alive,
    api_pids,
    descendants,
    has_words,
    listening_ports,
    video_status,
    wait_for,
)
from workers.runtime.ports import free_port, reserve_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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
        apis = api_pids(up)
        assert len(apis) == 2, apis
        assert {p for pid in apis for p in listening_ports({pid})} == {port, port + 1}
        with httpx.Client(base_url=a, timeout=30) as ca, httpx.Client(base_url=b, timeout=30) as cb:
            assert ca.get("/ready").status_code == 200 and cb.get("/ready").status_code == 200
            video = ca.post("/v1/videos", json=SMALL_JOB).json()["id"]  # created on A
            wait_for(
                lambda: video_status(cb, video)["status"] == "completed", "never completed", up
            )
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
    assert [pid for pid in tree if alive(pid)] == []


def test_redis_url_runs_the_stack_on_that_redis_without_valkey(
    tmp_path: Path, redis_db: int
) -> None:
    url = f"{REDIS_BASE_URL}/{redis_db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    up = Up(tmp_path / "data", free_port(), args=("--redis-url", url))
    try:
        valkeys = [pid for pid in descendants(up.proc.pid) if has_words(pid, ("valkey",))]
        assert valkeys == []
        with httpx.Client(base_url=up.url, timeout=30) as c:
            video = c.post("/v1/videos", json=SMALL_JOB).json()["id"]
            wait_for(lambda: video_status(c, video)["status"] == "completed", "never completed", up)
        # the broker, the job's events and the worker's presence are on that Redis
        assert client.exists(job_events_key(video))
        assert client.zcard(presence_key("reference/video")) == 1
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
        client.flushdb()
    assert code == 0
    assert [pid for pid in tree if alive(pid)] == []


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
            wait_for(lambda: video_status(c, video)["status"] == "completed", "never completed", up)
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
        assert not [p for p in descendants(up.proc.pid) if has_words(p, ("--realtime",))]
        assert up.proc.poll() is None  # still up
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    log = up.log.read_text()
    assert log.count("no streaming model is served, so no realtime worker starts") == 1, log
    assert "giving up" not in log and "exited with code" not in log
    assert code == 0
    assert [pid for pid in tree if alive(pid)] == []


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
            wait_for(lambda: video_status(c, video)["status"] == "completed", "never completed", up)
        frozen = [up.proc.pid, *descendants(up.proc.pid)]
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
            wait_for(lambda: c.get("/ready").status_code == 200, "/ready after SIGCONT", up)
            assert video_status(c, video)["status"] == "completed"
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    assert code == 0
    assert [pid for pid in tree if alive(pid)] == []


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
            wait_for(lambda: c.get("/ready").json()["unavailable_models"] == expected, "/ready", up)
            assert c.get("/health").json()["unavailable_models"] == expected
            refused = c.post("/v1/videos", json={"prompt": "a fox"})
            assert refused.status_code == 503 and reason in refused.text, refused.text
        assert up.proc.poll() is None  # still up
    finally:
        code, tree, _ = up.stop(signal.SIGTERM)
    log = up.log.read_text()
    assert "giving up" not in log and log.count("It exited with code 78") == 1
    assert code == 0
    assert [pid for pid in tree if alive(pid)] == []
