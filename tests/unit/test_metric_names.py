"""The metrics' names and labels (Prometheus conventions, no id labels), the HTTP
middleware's route-template labels, the queue collector's cache, the slot and job-end
accounting, the ports ``omniqueue up`` picks, and the dashboard and Prometheus files
against the metric names. The metrics moving on the real stack are in
``tests/integration/test_metrics.py``."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

import api.metrics as api_metrics
import storage.metrics as shared_metrics
import workers.common.metrics as worker_metrics
from api.metrics import HttpMetrics, QueueCollector
from cli.up import api_metrics_dirs, worker_metrics_ports
from storage.settings import MetricsSettings
from workers.common.metrics import SlotsCollector, SlotUsage

ROOT = Path(__file__).resolve().parents[2]
UNITS = ("_seconds", "_bytes")


def _wrappers() -> list[MetricWrapperBase]:
    """Every metric object the three modules define."""
    found = []
    for module in (api_metrics, worker_metrics, shared_metrics):
        found += [v for v in vars(module).values() if isinstance(v, MetricWrapperBase)]
    return found


def _collector_families(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The families of the custom collectors (queue, slots, GPU memory), collected on
    fake sources (a CUDA allocator that reports 1 byte)."""
    import torch

    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 1)
    queue = QueueCollector(lambda: {"m": (2, time.time() - 5)}, ["m"], 1.0)
    slots = SlotsCollector(SlotUsage(), ["m"], 2)
    gpu = worker_metrics.GpuMemoryCollector(["cuda:0"])
    return [*queue.collect(), *slots.collect(), *gpu.collect()]


def _defined_names(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    names = {w._name + ("_total" if w._type == "counter" else "") for w in _wrappers()}
    return names | {f.name for f in _collector_families(monkeypatch)}


def test_metric_objects_follow_the_conventions() -> None:
    wrappers = _wrappers()
    assert len(wrappers) >= 10
    for metric in wrappers:
        name, kind, labels = metric._name, metric._type, metric._labelnames
        assert name.startswith(shared_metrics.PREFIX), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        if kind == "histogram":
            assert name.endswith(UNITS), f"{name}: a histogram's name ends in its unit"
        if kind == "gauge":
            assert not name.endswith("_total"), name
        assert metric._documentation, f"{name} has no help text"
        for label in labels:
            assert label not in shared_metrics.UNBOUNDED_LABELS, (name, label)
            assert not label.endswith("_id"), (name, label)


def test_collector_families_follow_the_conventions(monkeypatch: pytest.MonkeyPatch) -> None:
    families = _collector_families(monkeypatch)
    assert {f.name for f in families} == {
        "omniqueue_queue_depth",
        "omniqueue_queue_oldest_age_seconds",
        "omniqueue_realtime_slots_busy",
        "omniqueue_realtime_slots_free",
        "omniqueue_gpu_memory_allocated_bytes",
        "omniqueue_gpu_memory_peak_bytes",
    }
    for family in families:
        assert family.type == "gauge" and family.documentation
        for sample in family.samples:
            assert set(sample.labels) <= {"model", "device"}, sample


def test_counters_are_exposed_with_total() -> None:
    text = shared_metrics.exposition(REGISTRY).decode()
    assert "# TYPE omniqueue_jobs_created_total counter" in text
    assert "# TYPE omniqueue_jobs_finished_total counter" in text
    assert "# TYPE omniqueue_http_request_duration_seconds histogram" in text


def _asgi_get(app: Any, *requests: tuple[str, str]) -> list[int]:
    async def run() -> list[int]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return [(await client.request(m, p)).status_code for m, p in requests]

    return asyncio.run(run())


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_http_metrics_label_by_route_template_and_status() -> None:
    app = FastAPI()

    @app.get("/t/things/{thing_id}")
    async def thing(thing_id: str) -> dict[str, str]:
        if thing_id == "boom":
            raise RuntimeError("unhandled")
        return {"id": thing_id}

    app.add_middleware(HttpMetrics)
    route = {"method": "GET", "route": "/t/things/{thing_id}"}
    before = {s: _value("omniqueue_http_requests_total", **route, status=s) for s in ("200", "500")}
    count = _value("omniqueue_http_request_duration_seconds_count", **route)
    unmatched = _value(
        "omniqueue_http_requests_total", method="GET", route="unmatched", status="404"
    )
    other = _value("omniqueue_http_requests_total", method="OTHER", route="unmatched", status="404")
    codes = _asgi_get(
        app,
        ("GET", "/t/things/a"),
        ("GET", "/t/things/b"),
        ("GET", "/t/things/boom"),
        ("GET", "/nowhere/1"),
        ("BREW", "/nowhere/2"),
    )
    assert codes == [200, 200, 500, 404, 404]
    assert _value("omniqueue_http_requests_total", **route, status="200") == before["200"] + 2
    assert _value("omniqueue_http_requests_total", **route, status="500") == before["500"] + 1
    assert _value("omniqueue_http_request_duration_seconds_count", **route) == count + 3
    # one series for every unmatched path, and for every unknown method
    assert _value(
        "omniqueue_http_requests_total", method="GET", route="unmatched", status="404"
    ) == (unmatched + 1)
    assert _value(
        "omniqueue_http_requests_total", method="OTHER", route="unmatched", status="404"
    ) == (other + 1)


class _Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def _gauges(collector: Any) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = shared_metrics.exposition(registry).decode()
    return {
        (s.name, s.labels.get("model", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_queue_collector_reads_once_per_cache_window() -> None:
    calls: list[float] = []
    clock = _Clock()

    def stats() -> dict[str, tuple[int, float]]:
        calls.append(clock.now)
        return {"a": (3, time.time() - 60)}

    collector = QueueCollector(stats, ["a", "b"], cache_s=1.0, clock=clock)
    first = _gauges(collector)
    clock.now += 0.5
    _gauges(collector)
    assert len(calls) == 1  # a second scrape within the window: no query
    assert first[("omniqueue_queue_depth", "a")] == 3
    assert first[("omniqueue_queue_depth", "b")] == 0  # served, nothing queued: 0, not absent
    assert 59 <= first[("omniqueue_queue_oldest_age_seconds", "a")] < 120
    assert first[("omniqueue_queue_oldest_age_seconds", "b")] == 0
    clock.now += 1.0
    _gauges(collector)
    assert len(calls) == 2


def test_queue_collector_leaves_the_queue_out_when_the_database_fails() -> None:
    def stats() -> dict[str, tuple[int, float]]:
        raise OSError("database down")

    assert _gauges(QueueCollector(stats, ["a"], cache_s=1.0)) == {}


def test_slots_collector_counts_the_worker_slots_per_model() -> None:
    usage = SlotUsage()
    collector = SlotsCollector(usage, ["voice", "world"], slots=2)
    with usage.running("voice"):
        busy = _gauges(collector)
    idle = _gauges(collector)
    assert busy[("omniqueue_realtime_slots_busy", "voice")] == 1
    assert busy[("omniqueue_realtime_slots_busy", "world")] == 0
    # the slots are shared: one busy slot leaves one for either model
    assert busy[("omniqueue_realtime_slots_free", "voice")] == 1
    assert busy[("omniqueue_realtime_slots_free", "world")] == 1
    assert idle[("omniqueue_realtime_slots_free", "voice")] == 2


class _Jobs:
    def __init__(self, row: Any) -> None:
        self.row = row

    def get(self, job_id: str) -> Any:
        return self.row


def _job(**values: Any) -> Any:
    base = {"id": "video_x", "model": "unit/model", "kind": "video", "status": "failed"}
    return SimpleNamespace(**{**base, "started_at": None, "error_code": None, **values})


def _finished(status: str, code: str) -> float:
    return _value(
        "omniqueue_jobs_finished_total", model="unit/model", kind="video", status=status, code=code
    )


def test_run_ended_counts_each_end_once() -> None:
    job = _job()
    completed, cancelled = _finished("completed", ""), _finished("failed", "cancelled")
    latency = _value("omniqueue_cancel_latency_seconds_count", model="unit/model", kind="video")
    stage = {"model": "unit/model", "kind": "video", "stage": "denoise"}
    denoise = _value("omniqueue_job_stage_duration_seconds_count", **stage)
    ended = worker_metrics.run_ended
    ended(_Jobs(None), job, "completed", {"queue": 0.1, "denoise": 2.0})  # type: ignore[arg-type]
    assert _finished("completed", "") == completed + 1
    assert _value("omniqueue_job_stage_duration_seconds_count", **stage) == denoise + 1
    # stopped by a cancel: counted, and timed from the row's cancel time
    row = _job(error_code="cancelled", completed_at=time.time() - 0.5)
    ended(_Jobs(row), job, "cancelled", {})  # type: ignore[arg-type]
    assert _finished("failed", "cancelled") == cancelled + 1
    count = "omniqueue_cancel_latency_seconds_count"
    assert _value(count, model="unit/model", kind="video") == latency + 1
    # taken over by another worker: that one counts it
    ended(_Jobs(_job(status="in_progress")), job, "cancelled", {})  # type: ignore[arg-type]
    assert _finished("failed", "cancelled") == cancelled + 1
    timeout = _finished("failed", "timeout")
    ended(_Jobs(None), job, "timeout", {})  # type: ignore[arg-type]
    assert _finished("failed", "timeout") == timeout + 1


def test_a_message_of_a_job_cancelled_while_queued_counts_it() -> None:
    cancelled = _finished("failed", "cancelled")
    worker_metrics.message_dropped(_job(error_code="cancelled"))  # type: ignore[arg-type]
    worker_metrics.message_dropped(_job(started_at=1.0))  # type: ignore[arg-type]  # a run ended it
    worker_metrics.message_dropped(_job(status="completed"))  # type: ignore[arg-type]
    assert _finished("failed", "cancelled") == cancelled + 1


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_up_gives_workers_free_distinct_ports(busy_port: int) -> None:
    metrics = MetricsSettings(worker_port=busy_port)
    ports = worker_metrics_ports("127.0.0.1", 3, metrics, taken={busy_port + 1})
    assert len(set(ports)) == 3
    assert busy_port not in ports and busy_port + 1 not in ports
    assert all(p is not None and p > busy_port for p in ports)
    assert worker_metrics_ports("127.0.0.1", 2, MetricsSettings(enabled=False), set()) == [None] * 2


def test_up_empties_a_metrics_dir_per_api_replica(tmp_path: Path) -> None:
    stale = tmp_path / "metrics" / "api-8000" / "counter_1.db"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    dirs = api_metrics_dirs(tmp_path, 8000, 2, 2, MetricsSettings())
    assert sorted(dirs) == [8000, 8001]
    assert all(d.is_dir() and not any(d.iterdir()) for d in dirs.values())
    assert api_metrics_dirs(tmp_path, 8000, 2, 1, MetricsSettings()) == {}


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((ROOT / "docs/grafana/omniqueue.json").read_text())
    exprs = []
    for panel in dashboard["panels"]:
        exprs += [t["expr"] for t in panel.get("targets", [])]
    return exprs


def test_the_dashboard_uses_exactly_the_defined_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    defined = _defined_names(monkeypatch)
    used = set()
    for expr in _dashboard_exprs():
        for name in re.findall(r"omniqueue_[a-z0-9_]+", expr):
            used.add(re.sub(r"_(bucket|count|sum)$", "", name))
    assert used <= defined, sorted(used - defined)
    assert defined <= used, f"not on the dashboard: {sorted(defined - used)}"


def test_prometheus_scrapes_the_compose_api_and_worker_ports() -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    worker_port = int(services["worker"]["environment"]["OMNIQ_METRICS__WORKER_PORT"])
    sender_port = int(services["webhooks"]["environment"]["OMNIQ_METRICS__WORKER_PORT"])
    targets = {
        name: (sd["names"][0], sd["port"])
        for name, job in jobs.items()
        for sd in job["dns_sd_configs"]
    }
    assert targets == {
        "omniqueue-api": ("api", 8000),
        "omniqueue-worker": ("worker", worker_port),
        "omniqueue-webhooks": ("webhooks", sender_port),
    }
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["metrics"]
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), volume
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"])


def test_each_webhook_attempt_is_counted_by_outcome() -> None:
    from workers.services.webhooks import record_outcome

    before = {
        o: _value("omniqueue_webhook_deliveries_total", outcome=o) for o in ("retry", "failed")
    }
    record_outcome("retry")
    record_outcome("retry")
    record_outcome("failed")
    assert _value("omniqueue_webhook_deliveries_total", outcome="retry") == before["retry"] + 2
    assert _value("omniqueue_webhook_deliveries_total", outcome="failed") == before["failed"] + 1
