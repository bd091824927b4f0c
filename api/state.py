"""Clients the API creates at startup and hands to routes (Starlette lifespan state).

Every backing call of a request is bounded: the synchronous Redis client (cancel, delete,
/ready) and the Celery publisher have a socket timeout, asyncio bus calls of a request
pass ``timeout_s`` (:mod:`storage.bus`), boto3 has connect/read timeouts and attempts, and
S3 work runs on a pool of its own so a stalled S3 cannot take the threads that serve
database reads. ``/ready`` probes the three services in parallel under one deadline.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import redis
import redis.asyncio
from sqlalchemy import Engine, text

from api.blocking import BlockingPool
from api.metrics import ApiMetrics, QueueCollector
from api.model_availability import ModelAvailability
from api.queue_admission import QueueAdmission, queue_admission
from api.quotas import Quotas
from models.catalog import ModelSpec
from storage.artifacts import ArtifactStore, make_s3_client
from storage.bus import AsyncEventBus, EventBus
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.keys import ApiKeyStore
from storage.queue import JobQueue, make_celery
from storage.session_state import SessionStateStore
from storage.settings import Settings
from storage.webhooks import WebhookStore
from storage.worker_presence import WorkerPresence

P = ParamSpec("P")
T = TypeVar("T")


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


def _sync_redis(settings: Settings) -> redis.Redis:
    """The API's blocking Redis client (thread pool): every command bounded."""
    return redis.Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.command_timeout_s,
        socket_connect_timeout=settings.redis.connect_timeout_s,
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
    s3_pool: ThreadPoolExecutor
    # Blocking calls of the request path (database, broker publishes): see ``blocking``.
    blocking_pool: BlockingPool
    # Duplex /v1/realtime sessions' state in Redis: any replica resumes any session.
    session_states: SessionStateStore
    # What GET /metrics reports (api/metrics.py).
    metrics: ApiMetrics
    # Per-key webhook endpoints and signing secrets (``/v1/webhooks/secret``).
    webhooks: WebhookStore
    # Per-key quotas (creates per minute, active jobs, sessions): api/quotas.py.
    quotas: Quotas
    # Per-model queue bound, default ttl and estimated starts: api/queue_admission.py.
    queue_bound: QueueAdmission
    # Models no live worker can load, and why (api/model_availability.py).
    availability: ModelAvailability
    # Live /v1/realtime sessions of this process by id: a cache in front of session_states
    # (a duplex resume on the replica that serves the session needs no Redis read).
    voice_sessions: dict[str, Any] = field(default_factory=dict)
    # World sessions (/v1/realtime/video) whose socket dropped, waiting for a session.resume
    # (held here so their keep-alive and grace tasks live on).
    detached_world_sessions: dict[str, Any] = field(default_factory=dict)
    # /ready: one thread per service, and a probe still running is awaited again rather
    # than stacked, so a stalled service holds one thread however often /ready is asked.
    _probe_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="ready")
    )
    _probes: dict[str, Future[Any]] = field(default_factory=dict)

    @classmethod
    def build(cls, settings: Settings, *, s3_client: Any | None = None) -> AppState:
        engine = make_engine(settings.database)
        sessions = make_sessionmaker(engine)
        s3_pool = ThreadPoolExecutor(settings.s3.api_threads, thread_name_prefix="s3")
        aredis = _async_redis(settings.redis.url)
        abus = AsyncEventBus(aredis, ttl_s=settings.events_ttl_s)
        jobs = JobStore(sessions, fair_share=settings.quotas.fair_share)
        served = settings.served_models()
        specs = {name: model.spec for name, model in served.items()}
        bus = EventBus(_sync_redis(settings), ttl_s=settings.events_ttl_s)
        job_models = [name for name, spec in specs.items() if not spec.streaming]
        queue = QueueCollector(jobs.queue_stats, job_models, settings.metrics.queue_cache_s)
        return cls(
            settings=settings,
            engine=engine,
            jobs=jobs,
            keys=ApiKeyStore(sessions),
            artifacts=ArtifactStore(
                s3_client or make_s3_client(settings.s3),
                settings.s3,
                presign_client=make_s3_client(settings.s3, public=True),
                executor=s3_pool,
            ),
            queue=JobQueue(make_celery(settings, publisher=True)),
            specs=specs,
            bus=bus,
            abus=abus,
            s3_pool=s3_pool,
            blocking_pool=BlockingPool(settings.http.threads),
            session_states=SessionStateStore(
                aredis,
                ttl_s=settings.realtime.state_ttl_s,
                log_events=settings.realtime.replay_events,
                stream_ttl_s=abus.ttl_s,  # the session's in stream, kept as the bus keeps it
                stream_maxlen=abus.maxlen,
            ),
            metrics=ApiMetrics(queue),
            webhooks=WebhookStore(sessions),
            quotas=Quotas(settings, aredis),
            queue_bound=queue_admission(jobs, bus.redis, served, settings.queue),
            availability=ModelAvailability(WorkerPresence(bus.redis), list(specs)),
        )

    async def aclose(self) -> None:
        self.queue.close()
        self.bus.redis.close()
        await self.abus.redis.aclose()
        self.engine.dispose()
        self.s3_pool.shutdown(wait=False, cancel_futures=True)
        self.blocking_pool.shutdown()
        self._probe_pool.shutdown(wait=False, cancel_futures=True)
        self.metrics.close()

    async def blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the API's ``OMNIQ_HTTP__THREADS`` threads
        (:class:`api.blocking.BlockingPool`: a third of the CPU per call of anyio's
        ``to_thread``, which Starlette's ``run_in_threadpool`` uses)."""
        return await self.blocking_pool.run(fn, *args, **kwargs)

    async def readiness(self) -> dict[str, str]:
        """Probe the database, Redis and S3 in parallel; ``ok``, the error class, or
        ``unavailable (no answer within N s)`` per service, within
        ``OMNIQ_HTTP__READY_TIMEOUT_S``."""
        probes: dict[str, Callable[[], None]] = {
            "database": self._ping_db,
            "redis": self._ping_redis,
            "s3": self.artifacts.ping,
        }
        futures = {name: asyncio.wrap_future(self._probe(name, fn)) for name, fn in probes.items()}
        for fut in futures.values():  # a late failure is read, never logged as unretrieved
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        timeout = self.settings.http.ready_timeout_s
        await asyncio.wait(futures.values(), timeout=timeout)
        checks: dict[str, str] = {}
        for name, fut in futures.items():
            if not fut.done():
                checks[name] = f"unavailable (no answer within {timeout:g} s)"
            elif (exc := fut.exception()) is not None:  # a probe reports, it never raises
                checks[name] = f"unavailable ({type(exc).__name__})"
            else:
                checks[name] = "ok"
        return checks

    async def unavailable_models(self, timeout: float | None = None) -> dict[str, str]:
        """The served models that no live worker can load → why
        (:class:`api.model_availability.ModelAvailability`): what ``/ready`` and
        ``/health`` both say. Read on the probe pool within ``timeout`` (default
        ``OMNIQ_HTTP__READY_TIMEOUT_S``); the last figures read when it takes longer."""
        future = asyncio.wrap_future(self._probe("models", self.availability.unavailable))
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        bound = self.settings.http.ready_timeout_s if timeout is None else timeout
        await asyncio.wait([future], timeout=bound)
        if future.done() and future.exception() is None:
            return future.result()
        return self.availability.last()

    def _probe(self, name: str, fn: Callable[[], T]) -> Future[T]:
        running = self._probes.get(name)
        if running is None or running.done():
            running = self._probes[name] = self._probe_pool.submit(fn)
        return running

    def _ping_db(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def _ping_redis(self) -> None:
        self.bus.redis.ping()
