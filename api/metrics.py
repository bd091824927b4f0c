"""The API's Prometheus metrics, served at ``GET /metrics`` (``api/routes/metrics.py``).

- HTTP requests by method, route template and status, and their duration
  (:class:`HttpMetrics`, a pure ASGI middleware);
- jobs created by model and kind; event-stream watchers open (SSE and WebSocket job
  streams); realtime sessions with an open socket, by kind (voice, video);
- queue depth and the age of the oldest queued job per model (what an autoscaler such as
  KEDA scales job workers on), read from the database when scraped
  (:class:`QueueCollector`).

Several API processes on one port (``omniqueue up --api-processes N``) keep their values
in files of one directory (prometheus-client's multiprocess mode,
``OMNIQ_METRICS__MULTIPROC_DIR``): a scrape lands on any of them and reports the sum of
all, dead processes' counters included; a process removes its gauges' files when it
stops (``mark_process_dead``). The queue collector is not in those files: it answers from
the database in the process that serves the scrape.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from storage.metrics import HTTP_BUCKETS, exposition, gauge_families, multiprocess

log = logging.getLogger(__name__)

HTTP_REQUESTS = Counter(
    "omniqueue_http_requests_total",
    "HTTP requests answered, by method, route template and status code.",
    ["method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "omniqueue_http_request_duration_seconds",
    "Time from a request's start to the end of its response (an SSE stream: its life).",
    ["method", "route"],
    buckets=HTTP_BUCKETS,
)
JOBS_CREATED = Counter(
    "omniqueue_jobs_created_total",
    "Jobs stored and enqueued, by model and kind.",
    ["model", "kind"],
)
WATCHERS = Gauge(
    "omniqueue_event_stream_watchers",
    "Job event streams open, by transport (sse, websocket).",
    ["transport"],
    multiprocess_mode="livesum",
)
REALTIME_SESSIONS = Gauge(
    "omniqueue_realtime_sessions",
    "Realtime sessions with an open socket on the API, by kind (voice, video).",
    ["kind"],
    multiprocess_mode="livesum",
)

# The queue collector's gauges: (name, help).
_QUEUE_GAUGES = (
    ("omniqueue_queue_depth", "Jobs queued (not yet claimed by a worker), by model."),
    (
        "omniqueue_queue_oldest_age_seconds",
        "How long the oldest queued job of a model has waited (0: none queued).",
    ),
)

# A route label for requests that matched no route (404s of unknown paths): one series,
# not one per path a scanner tries.
UNMATCHED = "unmatched"
# Methods outside this set count as OTHER (a client picks the method: an unbounded label).
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[..., Any]


class _RouteSeries:
    """The metric children of one route and method: the duration histogram's and the
    request counter's per status (made on first use, then a dict lookup)."""

    __slots__ = ("by_status", "duration", "method", "route")

    def __init__(self, method: str, route: str) -> None:
        self.method, self.route = method, route
        self.duration = HTTP_DURATION.labels(method, route)
        self.by_status: dict[int, Any] = {}

    def requests(self, status: int) -> Any:
        child = self.by_status.get(status)
        if child is None:
            child = self.by_status[status] = HTTP_REQUESTS.labels(self.method, self.route, status)
        return child


class HttpMetrics:
    """Pure ASGI middleware: count each HTTP request by method, route template and status
    and observe its duration. The route is the one the router matched (``scope["route"]``,
    set by Starlette's router), its template (``/v1/videos/{video_id}``) the label; the
    metric children are found through two dict lookups keyed by that template (a string
    of the route: its hash is cached) and the method, so a request allocates no label
    tuple. WebSockets are not counted here
    (``omniqueue_realtime_sessions``, ``omniqueue_event_stream_watchers``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._series: dict[str, dict[str, _RouteSeries]] = {}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0  # until the response starts

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            status = status or 499  # cancelled before answering (nginx's "client closed")
            raise
        finally:
            template = getattr(scope.get("route"), "path", None) or UNMATCHED
            series = self._route_series(template, scope["method"])
            series.duration.observe(time.perf_counter() - start)
            # no response started: the app raised, and the client gets a 500
            series.requests(status or 500).inc()

    def _route_series(self, template: str, method: str) -> _RouteSeries:
        by_method = self._series.get(template)
        if by_method is None:
            by_method = self._series[template] = {}
        series = by_method.get(method)
        if series is None:
            name = method if method in _METHODS else "OTHER"
            series = _RouteSeries(name, template)
            if name == method:  # an unknown method is not kept (the client picks it)
                by_method[method] = series
        return series


class QueueCollector:
    """``omniqueue_queue_depth`` and ``omniqueue_queue_oldest_age_seconds`` per model,
    from one SQL aggregate (:meth:`storage.jobs.JobStore.queue_stats`), reused for
    ``cache_s``: Prometheus, KEDA and a dashboard scraping together cost one query a
    second. Every served job model is reported, 0 when nothing is queued, so an
    autoscaler reads 0 rather than no data. A database that does not answer leaves both
    out of that scrape (logged); the rest of the scrape is served."""

    def __init__(
        self,
        stats: Callable[[], dict[str, tuple[int, float]]],
        models: Iterable[str],
        cache_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stats = stats
        self._models = list(models)
        self._cache_s = cache_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[int, float]] | None = None
        self._read_at = 0.0

    def stats(self) -> dict[str, tuple[int, float]]:
        """``model -> (queued, oldest created_at)``, at most ``cache_s`` old."""
        with self._lock:  # concurrent scrapes wait for one query, not run one each
            now = self._clock()
            if self._cached is None or now - self._read_at >= self._cache_s:
                self._cached, self._read_at = self._stats(), now
            return self._cached

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self.stats()
        except Exception:
            log.warning("metrics: could not read the queue depth", exc_info=True)
            return
        now = time.time()
        rows = []
        for model in sorted({*self._models, *stats}):
            count, oldest = stats.get(model, (0, now))
            rows.append((model, count, max(0.0, now - oldest)))
        yield from gauge_families("model", _QUEUE_GAUGES, rows)


class ApiMetrics:
    """What ``GET /metrics`` of this process reports: the module's metrics (this
    process's, or every process's of the multiprocess directory) and the queue."""

    def __init__(self, queue: QueueCollector) -> None:
        self.multiprocess = multiprocess()
        self.registry = CollectorRegistry()
        self.registry.register(queue)
        if self.multiprocess:
            MultiProcessCollector(self.registry)
            self._registries: tuple[CollectorRegistry, ...] = (self.registry,)
        else:
            self._registries = (REGISTRY, self.registry)

    def exposition(self) -> bytes:
        """The text exposition (blocking: it may read files and the database)."""
        return exposition(*self._registries)

    def close(self) -> None:
        """This process stops: its live gauges leave the multiprocess directory."""
        if self.multiprocess:
            mark_process_dead(os.getpid())
