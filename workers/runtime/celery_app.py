"""The worker's Celery app. Tasks are thin: parse the payload, hand it to the runner."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from celery import Celery, bootsteps
from celery.exceptions import SecurityWarning
from celery.signals import worker_ready, worker_shutting_down

from models.session_bus import TASKS, JobTask, SessionTask, VoiceSessionConfig
from models.worker_status import WorkerStatus
from storage.constants import TASK_RUN_JOB, TASK_RUN_SESSION, job_queue, realtime_queue
from storage.queue import make_celery
from storage.settings import Settings
from workers.common.memory import apply_memory_fraction
from workers.common.metrics import BROKER_RECONNECTS, serve_metrics
from workers.pipelines.run_ahead import configure_checkpoints
from workers.runtime.context import WorkerContext, worker_models
from workers.runtime.signal_wakeup import wake_on_signals
from workers.runtime.status_file import write_status
from workers.runtime.supervisor import CONFIG_ERROR

log = logging.getLogger(__name__)


def run_task(context: WorkerContext, payload: Any) -> str:
    """Run one task payload (``models.session_bus.TaskPayload`` as JSON)."""
    task = TASKS.validate_python(payload)
    if isinstance(task, JobTask):
        return context.executor.run(task.job_id, task.model)
    assert isinstance(task, SessionTask)
    if isinstance(task.config, VoiceSessionConfig):  # WS /v1/realtime
        return context.voice_sessions.run(task.session_id, task.config)
    # WS /v1/realtime/video; attempt > 1: taking over a session whose worker died
    return context.world_sessions.run(task.session_id, task.config, task.attempt)


class BrokerConnection(bootsteps.StartStopStep):
    """Counts the consumer's broker connections after the first: Celery restarts its
    consumer blueprint (this step included) each time it reconnects after losing the
    broker (``omniqueue_broker_reconnects_total``)."""

    requires = {"celery.worker.consumer.connection:Connection"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.started = 0

    def start(self, parent: Any) -> None:
        self.started += 1
        if self.started > 1:
            BROKER_RECONNECTS.inc()
            log.warning("broker connection restored (reconnect %d)", self.started - 1)


def create_worker_app(settings: Settings, context: WorkerContext) -> Celery:
    """A Celery app whose tasks run on ``context`` (built once per worker process)."""
    app = make_celery(settings, name="omniqueue-worker")
    app.steps["consumer"].add(BrokerConnection)

    @app.task(name=TASK_RUN_JOB, ignore_result=True)
    def run_job(payload: Any) -> str:
        return run_task(context, payload)

    @app.task(name=TASK_RUN_SESSION, ignore_result=True, acks_late=False)
    def run_session(payload: Any) -> str:
        # A session is not redelivered: its client is gone by the time it could be.
        return run_task(context, payload)

    return app


def serve(
    settings: Settings,
    name: str,
    *,
    realtime: bool = False,
    prepare: Callable[[WorkerContext], None] | None = None,
) -> int:
    """Run this process as a Celery worker of ``settings``' models until it is stopped:
    jobs one at a time (solo pool) or, for models whose steps it batches, up to
    ``OMNIQ_WORKER__BATCH_SIZE`` at once (threads), or sessions on
    ``OMNIQ_REALTIME__SLOTS`` threads.
    ``prepare`` runs on the context once its pipelines are loaded (a worker group's rank 0
    wraps them there). Returns the exit status."""
    try:
        queues = worker_queues(settings, realtime=realtime)
    except ValueError as exc:  # the registry, OMNIQ_MODELS or OMNIQ_WORKER__MODELS
        print(f"omniqueue worker: {exc}", file=sys.stderr)
        return CONFIG_ERROR
    if not realtime and settings.worker.batch_size > 1 and settings.worker.group_size > 1:
        print(
            "omniqueue worker: OMNIQ_WORKER__BATCH_SIZE above 1 needs a single-device worker "
            "(a worker group runs one job at a time)",
            file=sys.stderr,
        )
        return CONFIG_ERROR
    if not queues:
        kind = "streaming" if realtime else "job"
        size = settings.worker.group_size
        what = f" for {size} devices" if size > 1 else ""
        print(f"omniqueue worker: no {kind} model is served{what}", file=sys.stderr)
        return CONFIG_ERROR
    context = WorkerContext.build(settings, name=name, realtime=realtime)
    apply_memory_fraction(settings.worker.memory_fraction, model_devices(settings, realtime))
    configure_checkpoints(settings.worker.checkpoint_lookahead)
    context.load_models()  # each on its own: one that cannot load is reported, not served
    if not context.pipelines.models:
        return context.loaded_none()
    queues = served_queues(context.pipelines.models, realtime)
    if not realtime:  # OMNIQ_WORKER__BATCH_SIZE: the models whose steps it batches
        context.executor.start_batching()
    if realtime and settings.realtime.capacity_probe:
        context.world_sessions.probe()  # how many sessions of each world model keep real time
    if prepare is not None:
        prepare(context)
    context.start_background()
    streaming = worker_models(settings, realtime=True) if realtime else {}
    serve_metrics(settings, realtime_models=list(streaming))
    if realtime:
        # How soon a session thread woken by Redis gets the GIL (docs/PERFORMANCE.md).
        sys.setswitchinterval(settings.realtime.switch_interval_ms / 1000)
    app = create_worker_app(settings, context)
    _quiet_root_warning(settings)
    _say_when_ready(settings, context)
    worker_ready.connect(wake_on_signals, weak=False)  # a stop is seen at once, not in 1 s
    if not realtime:  # SIGTERM/SIGINT: the running job goes back to the queue
        drain = settings.worker.drain_timeout_s

        def stopping(**_: Any) -> None:
            context.executor.shutdown.request(drain)

        worker_shutting_down.connect(stopping, weak=False)
    # Jobs: one at a time per device (solo), or one thread per job of a batched model
    # (workers/jobs/batcher.py). Sessions: one thread per slot.
    at_once = settings.worker.batch_size if context.executor.batchers else 1
    threads = settings.realtime.slots if realtime else at_once
    pool = (
        ["--pool=threads", f"--concurrency={threads}"]
        if realtime or threads > 1
        else ["--pool=solo", "--concurrency=1"]
    )
    argv = [
        "worker",
        *pool,
        "--prefetch-multiplier=1",
        "-Q",
        ",".join(queues),
        "-n",
        f"{name}@%h",
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    try:
        app.worker_main(argv)
    finally:
        context.close()
    return 0


def _say_when_ready(settings: Settings, context: WorkerContext) -> None:
    """Once Celery consumes (its ``worker_ready``), write the worker's status file: the
    models it serves and why it could not load the others (``omniqueue up`` waits on
    it to say the stack is up)."""

    def ready(**_: Any) -> None:
        failed = {name: f.reason for name, f in context.load_failures.items()}
        models = list(context.pipelines.models)
        write_status(
            settings.worker.status_file,
            WorkerStatus(state="ready", models=models, failed=failed),
        )

    worker_ready.connect(ready, weak=False)


def _quiet_root_warning(settings: Settings) -> None:
    """Under ``omniqueue up`` (``OMNIQ_MODE=embedded``: a laptop, or a container whose user
    is root), leave out Celery's banner against running as root: it is about workers that
    accept pickle, and ours take JSON only (``storage/queue.py``). ``C_FORCE_ROOT`` cannot
    silence it (Celery 5 reads it only to let a root worker take pickle), so the one
    warning is filtered here; a deployment's workers (``production``) still print it."""
    if settings.mode == "embedded" and os.geteuid() == 0:
        warnings.filterwarnings(
            "ignore", message=".*superuser privileges", category=SecurityWarning
        )


def model_devices(settings: Settings, realtime: bool = False) -> list[str]:
    """The devices this worker loads its models on: its own, and any a registry entry
    names (``device``)."""
    models = worker_models(settings, realtime=realtime).values()
    return [settings.worker.device, *(m.device for m in models if m.device)]


def worker_queues(settings: Settings, *, realtime: bool = False) -> list[str]:
    return served_queues(worker_models(settings, realtime=realtime), realtime)


def served_queues(models: Iterable[str], realtime: bool) -> list[str]:
    """The broker queues of ``models``: their realtime ones, or their job ones."""
    return [(realtime_queue if realtime else job_queue)(m) for m in models]
