"""The worker's Celery app. Tasks are thin: parse the payload, hand it to the runner."""

from __future__ import annotations

from typing import Any

from celery import Celery

from models.session_bus import TASKS, JobTask, SessionTask, VoiceSessionConfig
from storage.constants import TASK_RUN_JOB, TASK_RUN_SESSION, job_queue, realtime_queue
from storage.queue import make_celery
from storage.settings import Settings
from workers.context import WorkerContext, worker_models


def run_task(context: WorkerContext, payload: Any) -> str:
    """Run one task payload (``models.session_bus.TaskPayload`` as JSON). A bare job id
    is a message queued before payloads were typed."""
    task = TASKS.validate_python(
        {"kind": "job", "job_id": payload} if isinstance(payload, str) else payload
    )
    if isinstance(task, JobTask):
        return context.executor.run(task.job_id)
    assert isinstance(task, SessionTask)
    if isinstance(task.config, VoiceSessionConfig):  # WS /v1/realtime
        return context.voice_sessions.run(task.session_id, task.config)
    return context.sessions.run(task.session_id, task.config)  # WS /v1/realtime/video


def create_worker_app(settings: Settings, context: WorkerContext) -> Celery:
    """A Celery app whose tasks run on ``context`` (built once per worker process)."""
    app = make_celery(settings, name="omniqueue-worker")

    @app.task(name=TASK_RUN_JOB, ignore_result=True)
    def run_job(payload: Any) -> str:
        return run_task(context, payload)

    @app.task(name=TASK_RUN_SESSION, ignore_result=True, acks_late=False)
    def run_session(payload: Any) -> str:
        # A session is not redelivered: its client is gone by the time it could be.
        return run_task(context, payload)

    return app


def worker_queues(settings: Settings, *, realtime: bool = False) -> list[str]:
    models = worker_models(settings, realtime=realtime)
    return [(realtime_queue if realtime else job_queue)(m) for m in models]
