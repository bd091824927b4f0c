"""A worker's Prometheus metrics, served on its own port (``OMNIQ_METRICS__WORKER_PORT``).

- jobs by how they ended (``omniqueue_jobs_finished_total{model,kind,status,code}``),
  counted by the worker that saw the end: its own run, a message of a job cancelled while
  queued (dropped at claim), a job failed ``worker_lost`` (claim or reconciler);
- per-stage durations of completed jobs (queue, prepare, denoise, decode, encode,
  upload: the executor's ``stage_durations``) and each denoise step's duration;
- cancel latency: from the cancel request (the job row's ``completed_at``, written by the
  API's cancel) to the worker having stopped (tensors released, device idle);
- GPU memory allocated and peak (since the current or last job started) per device, read
  when scraped; absent on a CPU worker;
- a realtime worker's session slots, busy and free, per model it serves;
- take-overs of jobs whose worker stopped heartbeating, and broker reconnects (a fault
  between hosts shows in both: docs/deployment.md, "Failures between hosts").

Why a port per worker and not the multiprocess directory the API uses: a worker is one
process per device, usually a container or pod of its own on a GPU host, which
Prometheus discovers and scrapes on its own (its ``instance`` label tells workers
apart), and a device's memory summed over processes would mean nothing. The API's
processes share one port, where a scrape cannot pick a process; workers share none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.metrics_core import Metric

from models.db import Job, JobStatus
from models.errors import ErrorCode
from storage.jobs import JobStore
from storage.metrics import (
    CANCEL_BUCKETS,
    STAGE_BUCKETS,
    STEP_BUCKETS,
    gauge_families,
    serve_port,
)
from storage.settings import Settings

log = logging.getLogger(__name__)

JOBS_FINISHED = Counter(
    "omniqueue_jobs_finished_total",
    "Jobs that ended, by model, kind, status (completed, failed) and error code "
    "('' when completed).",
    ["model", "kind", "status", "code"],
)
STAGE_SECONDS = Histogram(
    "omniqueue_job_stage_duration_seconds",
    "Time a completed job spent in each stage (queue, prepare, denoise, decode, encode, upload).",
    ["model", "kind", "stage"],
    buckets=STAGE_BUCKETS,
)
STEP_SECONDS = Histogram(
    "omniqueue_denoise_step_duration_seconds",
    "Time of one denoise step, by model.",
    ["model"],
    buckets=STEP_BUCKETS,
)
CANCEL_LATENCY = Histogram(
    "omniqueue_cancel_latency_seconds",
    "From a running job's cancel request to its worker having stopped it.",
    ["model", "kind"],
    buckets=CANCEL_BUCKETS,
)
TAKEOVERS = Counter(
    "omniqueue_job_takeovers_total",
    "Running jobs this worker took over because their worker stopped heartbeating "
    "(attempt + 1), by model.",
    ["model"],
)
BROKER_RECONNECTS = Counter(
    "omniqueue_broker_reconnects_total",
    "Times this worker's broker connection was lost and made again.",
)
COMPILE_SECONDS = Histogram(
    "omniqueue_compile_seconds",
    "Time to compile a model's denoiser blocks for one input shape: at worker start "
    "(when='warmup') or in the prepare stage of the first job of that shape (when='prepare').",
    ["model", "when"],
    buckets=(0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640),
)
RECOMPILES = Counter(
    "omniqueue_recompiles_total",
    "Graphs dynamo compiled while a job denoised, after its prepare stage (0 when every "
    "shape and variant was compiled before).",
    ["model"],
)
COMPILE_FALLBACKS = Counter(
    "omniqueue_compile_fallbacks_total",
    "Times a model's compiled blocks failed to compile and went back to eager.",
    ["model"],
)
STAGES = ("queue", "prepare", "denoise", "decode", "encode", "upload")
# The custom collectors' gauges: (name, help).
_SLOT_GAUGES = (
    ("omniqueue_realtime_slots_busy", "Realtime sessions on this worker, by model."),
    ("omniqueue_realtime_slots_free", "Session slots of this worker free to take a session."),
)
_GPU_GAUGES = (
    ("omniqueue_gpu_memory_allocated_bytes", "Device memory allocated by tensors now."),
    (
        "omniqueue_gpu_memory_peak_bytes",
        "Peak device memory allocated since the current (or last) job started.",
    ),
)
_CANCELLED = ErrorCode.CANCELLED.value


def job_finished(
    job: Job, status: str, code: str = "", durations: Mapping[str, float] | None = None
) -> None:
    """Count one job that ended (and observe its stage durations, when given)."""
    JOBS_FINISHED.labels(job.model, job.kind, status, code).inc()
    if not durations:
        return
    for stage in STAGES:
        seconds = durations.get(stage)
        if seconds is not None:
            STAGE_SECONDS.labels(job.model, job.kind, stage).observe(seconds)


def run_ended(jobs: JobStore, job: Job, outcome: str, durations: Mapping[str, float]) -> None:
    """The executor's run of ``job`` ended with ``outcome`` and its cleanup is done:
    ``completed``, a failure's code, or ``cancelled`` (stopped because the job is no
    longer ours: the row says whether a client cancelled it, and when)."""
    if outcome == "completed":
        job_finished(job, JobStatus.COMPLETED.value, "", durations)
        return
    if outcome not in (_CANCELLED, "database_lost"):
        job_finished(job, JobStatus.FAILED.value, outcome)
        return
    try:
        row = jobs.get(job.id)
    except Exception:  # metrics never fail a job: this one goes uncounted
        log.warning("metrics: could not read how job %s ended", job.id, exc_info=True)
        return
    if row is not None and row.error_code != _CANCELLED:
        return  # taken over by another worker, or failed by someone who counts it
    job_finished(job, JobStatus.FAILED.value, _CANCELLED)
    if row is not None and row.completed_at is not None:  # a deleted job keeps no time
        CANCEL_LATENCY.labels(job.model, job.kind).observe(max(0.0, time.time() - row.completed_at))


def message_dropped(job: Job) -> None:
    """A worker got the message of a job it will not run: one cancelled before any
    worker claimed it ended there (no worker counted it yet)."""
    if job.status == JobStatus.FAILED and job.started_at is None:
        job_finished(job, JobStatus.FAILED.value, job.error_code or _CANCELLED)


class SlotUsage:
    """Sessions running on this realtime worker's slots, by model."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy: dict[str, int] = {}

    @contextmanager
    def running(self, model: str) -> Iterator[None]:
        with self._lock:
            self.busy[model] = self.busy.get(model, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self.busy[model] -= 1


# The slot threads of this process (a realtime worker's Celery thread pool).
SLOTS = SlotUsage()


class SlotsCollector:
    """``omniqueue_realtime_slots_busy`` and ``_free`` per served streaming model: the
    slots are the worker's, shared by its models, so each model's free count is the
    worker's (summing free slots over models of one worker counts them twice)."""

    def __init__(self, usage: SlotUsage, models: Iterable[str], slots: int) -> None:
        self._usage, self._models, self._slots = usage, list(models), slots

    def collect(self) -> Iterator[Metric]:
        busy = dict(self._usage.busy)
        free = max(0, self._slots - sum(busy.values()))
        rows = ((model, busy.get(model, 0), free) for model in self._models)
        yield from gauge_families("model", _SLOT_GAUGES, rows)


class GpuMemoryCollector:
    """Device memory held by tensors on this worker's CUDA device, read when scraped
    (``torch.cuda.memory_allocated``; the peak since the executor reset it at the start
    of the current or last job, ``max_memory_allocated``)."""

    def __init__(self, devices: Iterable[str]) -> None:
        self._devices = list(devices)

    def collect(self) -> Iterator[Metric]:
        import torch

        rows = (
            (d, torch.cuda.memory_allocated(d), torch.cuda.max_memory_allocated(d))
            for d in self._devices
        )
        yield from gauge_families("device", _GPU_GAUGES, rows)


def serve_metrics(settings: Settings, *, realtime_models: Iterable[str] = ()) -> int | None:
    """Serve this worker's ``/metrics`` on ``OMNIQ_METRICS__WORKER_PORT`` (a thread,
    :func:`storage.metrics.serve_port`), with its GPU memory on a CUDA device and its
    slots on a realtime worker; the port, or None when off or the port is taken."""
    m = settings.metrics
    if not m.enabled or not m.worker_port:
        return None
    device = settings.worker.device
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            REGISTRY.register(GpuMemoryCollector([device]))
    if realtime_models:
        REGISTRY.register(SlotsCollector(SLOTS, realtime_models, settings.realtime.slots))
    return serve_port(m, "worker")
