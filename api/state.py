"""Clients the API creates at startup and hands to routes (Starlette lifespan state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from models.catalog import ModelSpec
from storage.artifacts import ArtifactStore, make_s3_client
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.keys import ApiKeyStore
from storage.queue import JobQueue, make_celery
from storage.settings import Settings


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    jobs: JobStore
    keys: ApiKeyStore
    artifacts: ArtifactStore
    queue: JobQueue
    specs: dict[str, ModelSpec]

    @classmethod
    def build(cls, settings: Settings, *, s3_client: Any | None = None) -> AppState:
        engine = make_engine(settings.database)
        sessions = make_sessionmaker(engine)
        return cls(
            settings=settings,
            engine=engine,
            jobs=JobStore(sessions),
            keys=ApiKeyStore(sessions),
            artifacts=ArtifactStore(
                s3_client or make_s3_client(settings.s3),
                settings.s3,
                presign_client=make_s3_client(settings.s3, public=True),
            ),
            queue=JobQueue(make_celery(settings)),
            specs=served_specs(settings),
        )

    def close(self) -> None:
        self.queue.close()
        self.engine.dispose()

    def readiness(self) -> dict[str, str]:
        """Reach every backing service; ``ok`` or the error class per service."""
        checks: dict[str, str] = {}
        for name, probe in (
            ("database", self._ping_db),
            ("redis", self.queue.ping),
            ("s3", self.artifacts.ping),
        ):
            try:
                probe()
                checks[name] = "ok"
            except Exception as exc:  # a readiness probe reports, it never raises
                checks[name] = f"unavailable ({type(exc).__name__})"
        return checks

    def _ping_db(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))


def served_specs(settings: Settings) -> dict[str, ModelSpec]:
    """The specs of the models this deployment serves, in the configured order."""
    return {name: model.spec for name, model in settings.served_models().items()}
