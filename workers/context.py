"""Per-process worker context: clients created once, handed to every task (arq's ``ctx``)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from sqlalchemy import Engine

from storage.artifacts import ArtifactStore, make_s3_client
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.settings import Settings
from workers.executor import StepExecutor
from workers.pipelines.registry import PipelineRegistry


@dataclass
class WorkerContext:
    settings: Settings
    engine: Engine
    jobs: JobStore
    artifacts: ArtifactStore
    pipelines: PipelineRegistry
    executor: StepExecutor
    worker_id: str

    @classmethod
    def build(cls, settings: Settings, name: str = "worker") -> WorkerContext:
        engine = make_engine(settings.database)
        jobs = JobStore(make_sessionmaker(engine))
        artifacts = ArtifactStore(make_s3_client(settings.s3), settings.s3)
        models = settings.worker.models or settings.models
        pipelines = PipelineRegistry(models, settings.worker.device)
        worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}"
        executor = StepExecutor(settings, jobs, artifacts, pipelines, worker_id)
        return cls(settings, engine, jobs, artifacts, pipelines, executor, worker_id)

    def close(self) -> None:
        self.engine.dispose()
