"""The worker's Celery app. Tasks are thin: resolve the job id, call the executor."""

from __future__ import annotations

from celery import Celery

from storage.constants import TASK_RUN_JOB, job_queue
from storage.queue import make_celery
from storage.settings import Settings
from workers.context import WorkerContext, worker_models


def create_worker_app(settings: Settings, context: WorkerContext) -> Celery:
    """A Celery app whose tasks run on ``context`` (built once per worker process)."""
    app = make_celery(settings, name="omniqueue-worker")

    @app.task(name=TASK_RUN_JOB, ignore_result=True)
    def run_job(job_id: str) -> str:
        return context.executor.run(job_id)

    return app


def worker_queues(settings: Settings) -> list[str]:
    return [job_queue(m) for m in worker_models(settings)]
