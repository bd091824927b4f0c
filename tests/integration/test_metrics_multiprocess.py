"""Two ``omniqueue api`` processes on one port (``SO_REUSEPORT``, as ``omniqueue up
--api-processes 2`` runs them) with one multiprocess metrics directory: whichever
process answers a scrape reports both processes' requests and creates, an SSE watcher
open on either, and the queue depth once (it comes from the database); a process that
stops takes its gauges with it and leaves its counts. And ``omniqueue up`` itself: the
line listing every scrape URL, a worker and the webhook sender answering on their ports,
both API processes of a replica counting in that replica's directory."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.integration.test_metrics import SMALL, Samples, scrape, value
from tests.integration.up_process import Up, api_pids
from workers.runtime.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APIS = ("api", "api1")


def _pids(directory: Path, prefix: str) -> set[int]:
    """The processes with a file of ``prefix`` (``counter``, ``gauge_livesum``) there."""
    return {
        int(m.group(1))
        for f in directory.iterdir()
        if (m := re.fullmatch(rf"{prefix}_(\d+)\.db", f.name))
    }


class TwoApis(Stack):
    metrics_dir: Path = Path()

    def start_apis(self) -> None:
        self.port = free_port()
        for name in APIS:
            self._spawn(name, "api", "--host", "127.0.0.1", "--port", str(self.port))
        self.wait_ready()
        pids = {self.procs[name].pid for name in APIS}
        deadline = time.monotonic() + 60
        # new connections until both processes have answered (and counted) one
        while not pids <= _pids(self.metrics_dir, "counter"):
            assert time.monotonic() < deadline, "the second API process never answered"
            httpx.get(self.url + "/ready", timeout=5)

    def scrapes(self, n: int = 8) -> list[Samples]:
        """``n`` scrapes, each on a new connection (so the kernel picks a process)."""
        return [scrape(f"{self.url}/metrics") for _ in range(n)]


@pytest.fixture(scope="module")
def apis(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[TwoApis]:
    work = module_dir
    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    env = {"OMNIQ_HTTP__REUSE_PORT": "true", "OMNIQ_METRICS__MULTIPROC_DIR": str(metrics_dir)}
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env, cls=TwoApis) as st:
        st.metrics_dir = metrics_dir
        st.start_apis()
        yield st


def test_every_scrape_reports_both_processes(apis: TwoApis) -> None:
    health = {"method": "GET", "route": "/health", "status": "200"}
    for _ in range(30):
        assert httpx.get(apis.url + "/health", timeout=5).status_code == 200
    created = []
    for _ in range(4):  # no worker listens: they stay queued
        resp = httpx.post(apis.url + "/v1/videos", json=SMALL, timeout=10)
        assert resp.status_code == 200, resp.text
        created.append(resp.json()["id"])
    for samples in apis.scrapes():
        assert value(samples, "omniqueue_http_requests_total", **health) == 30
        assert value(samples, "omniqueue_jobs_created_total", model="reference/video") == 4
        # the database's count, reported once (not once per process)
        assert value(samples, "omniqueue_queue_depth", model="reference/video") == 4


def test_live_gauges_sum_the_live_processes(apis: TwoApis) -> None:
    resp = httpx.post(apis.url + "/v1/videos", json=SMALL, timeout=10)
    vid = resp.json()["id"]
    sse = {"transport": "sse"}
    with httpx.stream("GET", f"{apis.url}/v1/videos/{vid}/events", timeout=10) as events:
        lines = events.iter_lines()  # held: dropping the iterator closes the stream
        next(lines)
        for samples in apis.scrapes():
            assert value(samples, "omniqueue_event_stream_watchers", **sse) == 1
    deadline = time.monotonic() + 30
    while any(value(s, "omniqueue_event_stream_watchers", **sse) for s in apis.scrapes(4)):
        assert time.monotonic() < deadline, "the closed stream is still counted"
        time.sleep(0.1)


def test_a_stopped_process_leaves_its_counts_and_takes_its_gauges(apis: TwoApis) -> None:
    health = {"method": "GET", "route": "/health", "status": "200"}
    before = value(apis.scrapes(1)[0], "omniqueue_http_requests_total", **health)
    pid = apis.procs["api1"].pid
    vid = httpx.post(apis.url + "/v1/videos", json=SMALL, timeout=10).json()["id"]
    for _ in range(60):  # until api1 has served a watcher (it has a gauge file then)
        if pid in _pids(apis.metrics_dir, "gauge_livesum"):
            break
        with httpx.stream("GET", f"{apis.url}/v1/videos/{vid}/events", timeout=10) as events:
            next(events.iter_lines())
    assert pid in _pids(apis.metrics_dir, "gauge_livesum")
    apis.stop_process("api1", signal.SIGTERM)
    assert pid not in _pids(apis.metrics_dir, "gauge_livesum")  # mark_process_dead
    assert pid in _pids(apis.metrics_dir, "counter")
    for samples in apis.scrapes(3):  # all answered by the one left
        assert value(samples, "omniqueue_http_requests_total", **health) == before


def _when_served(url: str, up: Up) -> str:
    """The exposition at ``url`` once it answers (a worker serves it once its pipelines
    are loaded)."""
    deadline = time.monotonic() + 90
    while True:
        try:
            return httpx.get(url, timeout=10).text
        except httpx.ConnectError:
            assert time.monotonic() < deadline, up.log.read_text()[-4000:]
            time.sleep(0.5)


def test_up_prints_every_scrape_url_and_shares_a_dir_per_replica(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = Up(data, free_port(), args=("--api-processes", "2", "--realtime-workers", "0"))
    try:
        line = next(ln for ln in up.log.read_text().splitlines() if ln.startswith("metrics: "))
        urls = re.findall(r"http://\S+/metrics", line)
        # the API, the worker, the webhook sender
        assert urls[0] == f"{up.url}/metrics" and len(urls) == 3, line
        assert "worker 0 " in line and "webhook sender " in line, line
        for url, family in (
            (urls[1], "omniqueue_jobs_finished_total"),
            (urls[2], "omniqueue_webhook_deliveries_total"),
        ):
            assert f"# TYPE {family} counter" in _when_served(url, up)
        directory = data / "metrics" / f"api-{up.port}"
        apis = set(api_pids(up))
        assert len(apis) == 2
        deadline = time.monotonic() + 60
        while not apis <= _pids(directory, "counter"):  # both count in the replica's dir
            assert time.monotonic() < deadline, sorted(p.name for p in directory.iterdir())
            httpx.get(up.url + "/health", timeout=5)
    finally:
        up.stop(signal.SIGTERM)
