"""``/metrics`` of the API and of a worker move with the jobs, on the real stack (an
``omniqueue api`` process and a real Celery worker with its metrics port): a completed
job counts its create, its HTTP requests, its end, its stage durations and its steps; a
cancelled one its end and its cancel latency; queued jobs raise the queue depth and
cancelling them brings it back to 0; an SSE watcher is counted while it is open; a
world session holds a slot of the realtime worker and a socket of the API.
Expositions are parsed with prometheus-client's own parser."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from workers.runtime.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = {"model": "reference/video", "kind": "video"}
STEPS = 4
SMALL = {"prompt": "a ball", "size": "64x48", "seconds": "0.5", "fps": 16}

# A world session long enough (seconds of 256x256 chunks) to hold its slot while scraped.
LONG_SESSION = {
    "type": "session.start",
    "model": "reference/world",
    "prompt": "a red ball at sunset",
    "width": 256,
    "height": 256,
    "num_frames": 957,
    "fps": 16,
}

Samples = list[tuple[str, dict[str, str], float]]


def scrape(url: str) -> Samples:
    """Every sample of ``url``'s exposition, read by prometheus-client's parser (on a
    fresh connection)."""
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    ]


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def eventually(read: Callable[[], Samples], check: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``check`` holds (a worker counts a job right after its cleanup, a
    moment after the API reports it ended; the queue depth is cached for 1 s)."""
    deadline = time.monotonic() + 30
    samples = read()
    while not check(samples):
        assert time.monotonic() < deadline, "metrics did not get there"
        time.sleep(0.1)
        samples = read()
    return samples


class MeteredStack(Stack):
    """The API, a job worker and a realtime worker, each worker on a metrics port."""

    ports: dict[str, int]

    def start_metered(self) -> None:
        self.ports = {}
        for name in ("w0", "rt0"):  # a port each: the environment of each spawn
            self.ports[name] = free_port()
            self.extra_env["OMNIQ_METRICS__WORKER_PORT"] = str(self.ports[name])
            if name == "w0":
                self.start(workers=1)
            else:
                self._spawn(name, "worker", "--realtime", "--name", name)
        self.wait_workers(2)

    def api_metrics(self) -> Samples:
        return scrape(f"{self.url}/metrics")

    def worker_metrics(self, name: str = "w0") -> Samples:
        return scrape(f"http://127.0.0.1:{self.ports[name]}/metrics")


@pytest.fixture(scope="module")
def mstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[MeteredStack]:
    work = module_dir
    env = {"OMNIQ_METRICS__WORKER_HOST": "127.0.0.1", "OMNIQ_REALTIME__SLOTS": "2"}
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env, cls=MeteredStack) as st:
        st.set_failpoints({})
        st.start_metered()
        yield st


@pytest.fixture
def client(mstack: MeteredStack) -> Iterator[httpx.Client]:
    with mstack.client_without_failpoints() as c:
        yield c


def _create(client: httpx.Client, **fields: Any) -> str:
    resp = client.post("/v1/videos", json={**SMALL, "num_inference_steps": STEPS, **fields})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def _finished(samples: Samples, status: str, code: str) -> float:
    return value(samples, "omniqueue_jobs_finished_total", **MODEL, status=status, code=code)


def test_a_completed_job_moves_the_api_and_worker_metrics(
    mstack: MeteredStack, client: httpx.Client
) -> None:
    api0, worker0 = mstack.api_metrics(), mstack.worker_metrics()
    vid = _create(client)
    assert mstack.wait_for(client, vid)["status"] == "completed"
    done = _finished(worker0, "completed", "") + 1
    worker1 = eventually(mstack.worker_metrics, lambda s: _finished(s, "completed", "") >= done)
    api1 = mstack.api_metrics()

    created = "omniqueue_jobs_created_total"
    assert value(api1, created, **MODEL) == value(api0, created, **MODEL) + 1
    requests = "omniqueue_http_requests_total"
    post = {"method": "POST", "route": "/v1/videos", "status": "200"}
    assert value(api1, requests, **post) == value(api0, requests, **post) + 1
    read = {"method": "GET", "route": "/v1/videos/{video_id}", "status": "200"}
    assert value(api1, requests, **read) > value(api0, requests, **read)
    duration = "omniqueue_http_request_duration_seconds_count"
    posts = {"method": "POST", "route": "/v1/videos"}
    assert value(api1, duration, **posts) == value(api0, duration, **posts) + 1
    assert value(api1, "omniqueue_queue_depth", model="reference/video") == 0

    for stage in ("queue", "prepare", "denoise", "decode", "encode", "upload"):
        name = "omniqueue_job_stage_duration_seconds_count"
        assert value(worker1, name, **MODEL, stage=stage) == (
            value(worker0, name, **MODEL, stage=stage) + 1
        ), stage
    steps = "omniqueue_denoise_step_duration_seconds_count"
    model = {"model": "reference/video"}
    assert value(worker1, steps, **model) == value(worker0, steps, **model) + STEPS
    assert value(worker1, "omniqueue_denoise_step_duration_seconds_sum", **model) > value(
        worker0, "omniqueue_denoise_step_duration_seconds_sum", **model
    )
    # a CPU worker has no GPU memory to report
    assert not [n for n, _, _ in worker1 if n.startswith("omniqueue_gpu_memory")]


def test_a_cancelled_job_moves_the_cancel_metrics(
    mstack: MeteredStack, client: httpx.Client
) -> None:
    mstack.set_failpoints({"step:2": "pause"})  # held in its denoise loop until cancelled
    worker0 = mstack.worker_metrics()
    vid = _create(client)
    mstack.wait_for(client, vid, until=("in_progress",))
    resp = client.post(f"/v1/videos/{vid}/cancel")
    assert resp.status_code == 200, resp.text
    body = mstack.wait_for(client, vid)
    assert (body["status"], body["error"]["code"]) == ("failed", "cancelled")

    latency = "omniqueue_cancel_latency_seconds_count"
    timed = value(worker0, latency, **MODEL) + 1
    worker1 = eventually(mstack.worker_metrics, lambda s: value(s, latency, **MODEL) >= timed)
    assert (
        _finished(worker1, "failed", "cancelled") == _finished(worker0, "failed", "cancelled") + 1
    )
    assert value(worker1, "omniqueue_cancel_latency_seconds_sum", **MODEL) > value(
        worker0, "omniqueue_cancel_latency_seconds_sum", **MODEL
    )
    # a cancelled job's stages are not in the durations of completed ones
    name = "omniqueue_job_stage_duration_seconds_count"
    assert value(worker1, name, **MODEL, stage="decode") == value(
        worker0, name, **MODEL, stage="decode"
    )
    api = mstack.api_metrics()
    cancel = {"method": "POST", "route": "/v1/videos/{video_id}/cancel", "status": "200"}
    assert value(api, "omniqueue_http_requests_total", **cancel) >= 1


def test_queue_depth_and_watchers_follow_the_queue(
    mstack: MeteredStack, client: httpx.Client
) -> None:
    depth = {"model": "reference/video"}

    def queued(n: int) -> Callable[[Samples], bool]:
        return lambda s: value(s, "omniqueue_queue_depth", **depth) == n

    mstack.set_failpoints({"step:1": "pause"})  # the one worker is held by the first job
    worker0 = mstack.worker_metrics()
    running = _create(client)
    mstack.wait_for(client, running, until=("in_progress",))
    waiting = [_create(client), _create(client)]
    api = eventually(mstack.api_metrics, queued(2))
    assert value(api, "omniqueue_queue_oldest_age_seconds", **depth) > 0

    with client.stream("GET", f"/v1/videos/{waiting[0]}/events") as events:
        assert events.status_code == 200
        lines = events.iter_lines()  # held: dropping the iterator closes the stream
        next(lines)  # the stream is open
        sse = {"transport": "sse"}
        eventually(
            mstack.api_metrics, lambda s: value(s, "omniqueue_event_stream_watchers", **sse) == 1
        )
    eventually(
        mstack.api_metrics, lambda s: value(s, "omniqueue_event_stream_watchers", **sse) == 0
    )
    ws_url = mstack.url.replace("http://", "ws://") + f"/v1/videos/{waiting[1]}/stream"
    socket = {"transport": "websocket"}
    with connect(ws_url) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "status"
        eventually(
            mstack.api_metrics, lambda s: value(s, "omniqueue_event_stream_watchers", **socket) == 1
        )

    for vid in waiting:  # cancelled while queued
        assert client.post(f"/v1/videos/{vid}/cancel").status_code == 200
    # the server finds the closed socket when it next writes to it: the cancel's event
    eventually(
        mstack.api_metrics, lambda s: value(s, "omniqueue_event_stream_watchers", **socket) == 0
    )
    api = eventually(mstack.api_metrics, queued(0))
    assert value(api, "omniqueue_queue_oldest_age_seconds", **depth) == 0
    assert client.post(f"/v1/videos/{running}/cancel").status_code == 200
    # the running job, and the two whose messages the worker then drops, each once
    stopped = _finished(worker0, "failed", "cancelled") + 3
    eventually(mstack.worker_metrics, lambda s: _finished(s, "failed", "cancelled") == stopped)


def test_a_realtime_session_holds_a_slot_and_a_socket(mstack: MeteredStack) -> None:
    world = {"model": "reference/world"}
    video = {"kind": "video"}
    sessions = "omniqueue_realtime_sessions"

    def rt() -> Samples:
        return mstack.worker_metrics("rt0")

    assert value(rt(), "omniqueue_realtime_slots_free", **world) == 2
    url = mstack.url.replace("http://", "ws://") + "/v1/realtime/video"
    with connect(url, max_size=16 * 1024 * 1024) as ws:
        ws.send(json.dumps(LONG_SESSION))
        assert json.loads(ws.recv(timeout=30))["type"] == "video.start"
        busy = eventually(rt, lambda s: value(s, "omniqueue_realtime_slots_busy", **world) == 1)
        assert value(busy, "omniqueue_realtime_slots_free", **world) == 1
        assert value(mstack.api_metrics(), sessions, **video) == 1
        ws.send(json.dumps({"type": "session.stop"}))
    eventually(rt, lambda s: value(s, "omniqueue_realtime_slots_free", **world) == 2)
    eventually(mstack.api_metrics, lambda s: value(s, sessions, **video) == 0)
