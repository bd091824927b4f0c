"""Per-process worker context: clients created once, handed to every task (arq's ``ctx``)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from functools import partial

import redis
from sqlalchemy import Engine

from models.registry import ServedModel
from models.worker_status import WorkerStatus
from storage.artifacts import ArtifactStore, make_s3_client, s3_object_bytes
from storage.bus import EventBus
from storage.db import make_engine, make_sessionmaker
from storage.jobs import JobStore
from storage.queue import JobQueue, dead_link_options, make_celery
from storage.settings import Settings
from storage.worker_presence import PresenceLease, WorkerPresence
from workers.jobs.executor import StepExecutor
from workers.jobs.temp_dirs import TempDirs, temp_root
from workers.pipelines.load_failure import LoadFailure
from workers.pipelines.registry import PipelineRegistry
from workers.runtime.status_file import write_status
from workers.runtime.supervisor import CONFIG_ERROR
from workers.services.reconciler import Reconciler, start_reconciler_thread
from workers.sessions.persist import SessionPersister
from workers.sessions.voice import VoiceSessionRunner
from workers.sessions.world import WorldSessionRunner

log = logging.getLogger(__name__)


def worker_models(settings: Settings, *, realtime: bool = False) -> dict[str, ServedModel]:
    """The served models this worker runs (``OMNIQ_WORKER__MODELS``, default all): the
    streaming ones for a realtime worker, the others for a job worker; of those, the ones
    whose ``devices`` is this worker's group size (1 for a single-device worker), so a
    job that needs two GPUs is only ever placed on a group of two."""
    size = settings.worker.group_size
    served = {
        name: model
        for name, model in settings.served_models().items()
        if model.spec.streaming == realtime
    }
    fitting = {name: m for name, m in served.items() if m.devices == size}
    named = [m for m in settings.worker.models if m in served]
    misfit = [f"{m} ({served[m].devices})" for m in named if m not in fitting]
    if misfit:
        raise ValueError(
            f"OMNIQ_WORKER__MODELS names model(s) for another number of devices than this "
            f"worker's {size}: {', '.join(misfit)}"
        )
    return {name: fitting[name] for name in named or fitting}


@dataclass
class WorkerContext:
    settings: Settings
    engine: Engine
    jobs: JobStore
    artifacts: ArtifactStore
    pipelines: PipelineRegistry
    executor: StepExecutor
    worker_id: str
    reconciler: Reconciler
    world_sessions: WorldSessionRunner
    voice_sessions: VoiceSessionRunner
    # This process's job temp directories: its job runs make them, its reconciler
    # thread sweeps the others (workers/jobs/temp_dirs.py).
    temp_dirs: TempDirs
    realtime: bool = False
    # This worker's place, the same across its restarts (host and ``--name``): its
    # models' load-failure records are kept under it (storage/worker_presence.py).
    slot: str = ""
    # The models this worker could not load (:meth:`load_models`), by name.
    load_failures: dict[str, LoadFailure] = field(default_factory=dict)
    _stop_reconciler: threading.Event | None = None
    _presence: PresenceLease | None = None

    @classmethod
    def build(
        cls, settings: Settings, name: str = "worker", *, realtime: bool = False
    ) -> WorkerContext:
        engine = make_engine(settings.database)
        jobs = JobStore(make_sessionmaker(engine))
        artifacts = ArtifactStore(make_s3_client(settings.s3), settings.s3)
        pipelines = PipelineRegistry(
            worker_models(settings, realtime=realtime),
            settings.worker.device,
            lora=settings.lora,
            fetch=partial(s3_object_bytes, artifacts.client),
            random_weights=settings.worker.random_weights,
        )
        worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}"
        client = redis.Redis.from_url(
            settings.redis.url,
            socket_timeout=settings.redis.worker_timeout_s,
            socket_connect_timeout=settings.redis.connect_timeout_s,
            socket_keepalive=True,
            socket_keepalive_options=dead_link_options(settings.redis.worker_timeout_s),
            health_check_interval=30,
        )
        bus = EventBus(
            client, ttl_s=settings.events_ttl_s, backoff_s=settings.redis.worker_timeout_s
        )
        temp_dirs = TempDirs(temp_root(settings))
        queue = JobQueue(make_celery(settings))
        executor = StepExecutor(
            settings, jobs, artifacts, pipelines, worker_id, bus, temp_dirs, queue.enqueue
        )
        reconciler = Reconciler(settings, jobs, artifacts, queue, client)
        persist = SessionPersister(settings, jobs, artifacts)
        world_sessions = WorldSessionRunner(settings, pipelines, bus, worker_id, persist)
        voice_sessions = VoiceSessionRunner(settings, pipelines, bus, worker_id)
        return cls(
            settings,
            engine,
            jobs,
            artifacts,
            pipelines,
            executor,
            worker_id,
            reconciler,
            world_sessions,
            voice_sessions,
            temp_dirs,
            realtime,
            slot=f"{socket.gethostname()}:{name}",
        )

    def load_models(self) -> dict[str, LoadFailure]:
        """Load each model on its own (:meth:`PipelineRegistry.load_each`): those that
        cannot load are not served, and why is recorded with this worker's presence
        (:meth:`start_background`), or by :meth:`loaded_none`."""
        self.load_failures = self.pipelines.load_each()
        return self.load_failures

    def loaded_none(self) -> int:
        """This worker loaded none of its models: it records why for
        ``OMNIQ_WORKER__LOAD_FAILURE_TTL_S`` (it exits; the API goes on naming the
        reason), fails the queued jobs that no live worker can serve, closes, and returns
        its exit status: :data:`CONFIG_ERROR` when no failure is one a restart could
        mend (``up`` then leaves it stopped), 1 otherwise (it is restarted)."""
        failed = self.load_failures
        lines = "; ".join(f"{name!r}: {f.reason}" for name, f in failed.items())
        print(f"omniqueue worker: no model could be loaded: {lines}", file=sys.stderr)
        reasons = {name: f.reason for name, f in failed.items()}
        write_status(
            self.settings.worker.status_file, WorkerStatus(state="stopped", failed=reasons)
        )
        try:
            ttl = self.settings.worker.load_failure_ttl_s
            presence = WorkerPresence(self.reconciler.redis)
            presence.renew([], self.worker_id, ttl, reasons, self.slot)
            self.reconciler.fail_unavailable()
        except Exception:  # Redis or the database down: nothing more to do on the way out
            log.warning("could not record this worker's load failures", exc_info=True)
        finally:
            self.close()
        return CONFIG_ERROR if all(f.config for f in failed.values()) else 1

    def start_background(self) -> None:
        """Start the reconciler loop (every worker runs one; a lock serializes passes;
        each pass after a sweep of this machine's job temp directories) and the presence
        lease on the models it loaded (as many jobs of each as it runs at once), with the
        records of those it could not (``storage/worker_presence.py``)."""
        w = self.settings.worker
        if w.reconcile_interval_s > 0:
            self._stop_reconciler = start_reconciler_thread(
                self.reconciler, w.reconcile_interval_s, self.temp_dirs
            )
        self._presence = PresenceLease(
            WorkerPresence(self.reconciler.redis),
            list(self.pipelines.models),
            self.worker_id,
            every_s=w.heartbeat_s,
            lease_s=w.heartbeat_timeout_s,
            failed={name: f.reason for name, f in self.load_failures.items()},
            slot=self.slot,
            memory=self.pipelines.memory,
            jobs={name: w.batch_size for name in self.executor.batchers},
        )

    def close(self) -> None:
        for batcher in self.executor.batchers.values():
            batcher.close()
        if self._stop_reconciler is not None:
            self._stop_reconciler.set()
        if self._presence is not None:
            self._presence.stop()
        self.reconciler.queue.close()
        self.reconciler.redis.close()
        self.engine.dispose()
