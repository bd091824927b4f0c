"""Prometheus metrics: the conventions, and what either tier may count.

Names follow Prometheus' conventions (docs/metrics.md lists every metric): the
``omniqueue_`` prefix, base units in the name (``_seconds``, ``_bytes``), ``_total`` on
counters. Labels are small closed sets (model, kind, status, code, stage, route template,
method, device, transport, outcome), never a job, session or key id: each label value is
a time series kept for as long as Prometheus keeps data.

Where each metric lives: the API's in :mod:`api.metrics` (``GET /metrics``), the
workers' in :mod:`workers.common.metrics` (each worker's own port, ``OMNIQ_METRICS__WORKER_PORT``),
and here the ones a component of either tier counts. Metric objects are module-level, as
prometheus-client has them: one per process, registered once. Whether their values live
in memory or in files of a directory shared by the API processes of one port
(prometheus-client's multiprocess mode) is decided when ``prometheus_client`` is first
imported, from ``PROMETHEUS_MULTIPROC_DIR``; ``omniqueue api`` sets it from
``OMNIQ_METRICS__MULTIPROC_DIR`` before it imports the app (``cli/main.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
    start_http_server,
    values,
)
from prometheus_client.metrics_core import GaugeMetricFamily

if TYPE_CHECKING:
    from storage.settings import MetricsSettings

# No ``*_created`` series (a timestamp per counter and histogram child): they double the
# series of every counter, and nothing here reads them (rate() needs none).
disable_created_metrics()

PREFIX = "omniqueue_"
# Label names that would make a series per job, session or key.
UNBOUNDED_LABELS = frozenset({"id", "job", "job_id", "session", "session_id", "key", "owner"})

# Buckets (seconds) of the histograms: wide enough for a 1 ms status read and an hour-long
# job, few enough that a histogram stays a handful of series per label set.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CANCEL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Counted by the webhook sender (``workers/services/webhooks.py``), one per delivery attempt:
# ``delivered`` (2xx), ``retry`` (5xx, 408, 429, a timeout or a connection error: tried
# again later), ``failed`` (any other answer, or the event grew too old to retry).
WEBHOOK_DELIVERIES = Counter(
    "omniqueue_webhook_deliveries_total",
    "Webhook delivery attempts by outcome (delivered, retry, failed).",
    ["outcome"],
)


def multiprocess() -> bool:
    """Whether this process keeps its metrics in the multiprocess directory (decided when
    ``prometheus_client`` was imported)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def exposition(*registries: CollectorRegistry) -> bytes:
    """The text exposition of ``registries``, one after the other (their metric names
    must not overlap)."""
    return b"".join(generate_latest(registry) for registry in registries)


def gauge_families(
    label: str, described: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]
) -> list[GaugeMetricFamily]:
    """Gauge families of a custom collector (values read when scraped): one per
    ``(name, help)`` of ``described``, each with the one label ``label``; each row of
    ``rows`` is a label value, then one value per family."""
    families = [GaugeMetricFamily(name, text, labels=[label]) for name, text in described]
    for key, *row in rows:
        for family, sample in zip(families, row, strict=True):
            family.add_metric([key], sample)
    return families


def serve_port(settings: MetricsSettings, who: str) -> int | None:
    """Serve this process's metrics (the default registry) on
    ``OMNIQ_METRICS__WORKER_PORT``, from a thread, as a worker and the webhook sender do;
    the port, or None when off. A port in use is reported on stderr and the process runs
    on without metrics (a scrape target down is better than a worker down)."""
    if not settings.enabled or not settings.worker_port:
        return None
    where = f"{settings.worker_host}:{settings.worker_port}"
    try:
        start_http_server(settings.worker_port, addr=settings.worker_host)
    except OSError as exc:
        print(
            f"omniqueue {who}: no metrics: cannot listen on {where} ({exc.strerror})",
            file=sys.stderr,
            flush=True,
        )
        return None
    print(f"omniqueue {who}: metrics on http://{where}/metrics", file=sys.stderr, flush=True)
    return settings.worker_port
