"""Clients the API creates at startup and hands to routes (Starlette lifespan state)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from sqlalchemy import Engine, text

from models.catalog import ModelSpec
from storage.artifacts import ArtifactStore, make_s3_client
from storage.bus import AsyncEventBus, EventBus
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.keys import ApiKeyStore
from storage.queue import JobQueue, make_celery
from storage.settings import Settings


def _async_redis(url: str) -> redis.asyncio.Redis:
    """The API's asyncio Redis client. No per-command socket timeout: redis-py arms an
    asyncio timer for each command under one, and at a few thousand bus commands a second
    (realtime sessions) the event loop spent a fifth of its time sorting those timers.
    A dead connection is found by TCP keep-alive instead (probes after 10 s idle, every
    5 s, 3 tries) and by a PING before reusing a connection idle for 30 s."""
    keepalive = {}
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            keepalive[getattr(socket, name)] = value
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=None,
        socket_connect_timeout=10,
        socket_keepalive=True,
        socket_keepalive_options=keepalive,
        health_check_interval=30,
    )


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    jobs: JobStore
    keys: ApiKeyStore
    artifacts: ArtifactStore
    queue: JobQueue
    specs: dict[str, ModelSpec]
    bus: EventBus
    abus: AsyncEventBus
    # Live /v1/realtime sessions of this process by id (duplex resume looks them up).
    voice_sessions: dict[str, Any] = field(default_factory=dict)

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
            bus=EventBus(redis.Redis.from_url(settings.redis.url), ttl_s=settings.events_ttl_s),
            abus=AsyncEventBus(_async_redis(settings.redis.url), ttl_s=settings.events_ttl_s),
        )

    async def aclose(self) -> None:
        self.queue.close()
        self.bus.redis.close()
        await self.abus.redis.aclose()
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
