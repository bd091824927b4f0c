"""The worker's Celery app. Tasks are thin: resolve the job id, call the executor."""

from __future__ import annotations

from typing import Any

from celery import Celery

from storage.constants import TASK_RUN_JOB, TASK_RUN_SESSION, job_queue, realtime_queue
from storage.queue import make_celery
from storage.settings import Settings
from workers.context import WorkerContext, worker_models


def create_worker_app(settings: Settings, context: WorkerContext) -> Celery:
    """A Celery app whose tasks run on ``context`` (built once per worker process)."""
    app = make_celery(settings, name="omniqueue-worker")

    @app.task(name=TASK_RUN_JOB, ignore_result=True)
    def run_job(job_id: str) -> str:
        return context.executor.run(job_id)

    @app.task(name=TASK_RUN_SESSION, ignore_result=True, acks_late=False)
    def run_session(session_id: str, config: dict[str, Any]) -> str:
        # A session is not redelivered: its client is gone by the time it could be.
        if config.get("kind") == "voice":  # WS /v1/realtime; video sessions have no kind
            return context.voice_sessions.run(session_id, config)
        return context.sessions.run(session_id, config)

    return app


def worker_queues(settings: Settings, *, realtime: bool = False) -> list[str]:
    models = worker_models(settings, realtime=realtime)
    return [(realtime_queue if realtime else job_queue)(m) for m in models]
