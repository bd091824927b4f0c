"""The broker side both tiers share: Celery configuration and the job enqueuer.

The API only *sends* tasks by name (it never imports ``workers``); the worker builds its
Celery app from the same :func:`celery_config`, so both agree on queues and transport
options.
"""

from __future__ import annotations

import socket
from typing import Any

from celery import Celery

from models.session_bus import JobTask, SessionConfig, SessionTask
from storage import broker_transport
from storage.constants import TASK_RUN_JOB, TASK_RUN_SESSION, job_queue, realtime_queue
from storage.settings import Settings


def dead_link_options(timeout_s: float) -> dict[int, int]:
    """TCP options (redis-py's ``socket_keepalive_options``) that end a connection whose
    link died within about ``2 × timeout_s``, whether it was idle (keepalive probes) or
    waiting on bytes the other side never acknowledged (``TCP_USER_TIMEOUT``): the
    kernel's own limit is about 15 minutes, which is how long a worker's broker
    connection otherwise hung on in a partition."""
    probe = max(1, round(timeout_s / 3))
    return {
        socket.TCP_KEEPIDLE: probe,
        socket.TCP_KEEPINTVL: probe,
        socket.TCP_KEEPCNT: 3,
        socket.TCP_USER_TIMEOUT: round(timeout_s * 2000),
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings as docs/architecture.md rule 8 requires: at-least-once, one job at a time."""
    # Redis redelivers an unacknowledged message after the visibility timeout; keep it
    # above the longest job a client may ask for so a running job is never duplicated.
    visibility = int(settings.limits.max_job_timeout_s * 2 + 600)
    return {
        "broker_url": settings.redis.url,
        "broker_connection_retry_on_startup": True,
        # A worker's broker commands are bounded too: on a dead link it notices, logs the
        # lost connection and reconnects (for as long as it takes) once the link is back.
        "broker_transport_options": {
            "visibility_timeout": visibility,
            "socket_timeout": settings.redis.worker_timeout_s,
            "socket_connect_timeout": settings.redis.connect_timeout_s,
            "socket_keepalive": True,
            "socket_keepalive_options": dead_link_options(settings.redis.worker_timeout_s),
        },
        "broker_connection_max_retries": None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_concurrency": 1,
        "worker_pool": "solo",
        "worker_hijack_root_logger": False,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_default_queue": "jobs.default",
        "worker_send_task_events": False,
        "worker_enable_remote_control": True,
        # a failed ack must not leave a worker deaf (storage/broker_transport.py)
        **(
            {"broker_transport": broker_transport.WORKER_PATH}
            if settings.redis.url.startswith("redis://")
            else {}
        ),
    }


def publisher_config(settings: Settings) -> dict[str, Any]:
    """:func:`celery_config` for the API, which only publishes: every broker command is
    bounded by ``OMNIQ_REDIS__COMMAND_TIMEOUT_S`` and a failed publish is retried once
    (on a fresh connection), so a stalled broker costs a create at most about three
    timeouts, then 503 ``broker_error``. Workers are bounded by
    ``OMNIQ_REDIS__WORKER_TIMEOUT_S`` instead (:func:`celery_config`)."""
    config = celery_config(settings)
    redis = settings.redis
    config["broker_transport_options"] = {
        **config["broker_transport_options"],
        "socket_timeout": redis.command_timeout_s,
        "socket_connect_timeout": redis.connect_timeout_s,
    }
    config["broker_connection_timeout"] = redis.connect_timeout_s
    if redis.url.startswith("redis://"):  # one client per channel, not one per publish
        config["broker_transport"] = broker_transport.PATH
    config["task_publish_retry_policy"] = {
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.2,
    }
    return config


def make_celery(settings: Settings, name: str = "omniqueue", *, publisher: bool = False) -> Celery:
    """The Celery app; ``publisher=True`` for the API (see :func:`publisher_config`)."""
    app = Celery(name, set_as_current=False)
    app.conf.update(publisher_config(settings) if publisher else celery_config(settings))
    return app


class JobQueue:
    """Puts tasks on the broker, each with one argument: a ``models.session_bus``
    task payload as JSON. Idempotent: the Celery task id is the job (session) id."""

    def __init__(self, app: Celery) -> None:
        self._app = app

    def enqueue(self, job_id: str, model: str) -> None:
        payload = JobTask(job_id=job_id, model=model).model_dump(mode="json")
        self._app.send_task(TASK_RUN_JOB, args=[payload], task_id=job_id, queue=job_queue(model))

    def start_session(
        self, session_id: str, config: SessionConfig, *, expires_s: float, attempt: int = 1
    ) -> None:
        """Place a realtime session on its model's realtime queue (``attempt`` > 1: again,
        to be taken over from its checkpoint). A message no worker took within
        ``expires_s`` is discarded by Celery instead of being run late."""
        model = config.model
        task = SessionTask(session_id=session_id, config=config, attempt=attempt)
        payload = task.model_dump(mode="json")
        self._app.send_task(
            TASK_RUN_SESSION,
            args=[payload],
            task_id=session_id if attempt == 1 else f"{session_id}.{attempt}",
            queue=realtime_queue(model),
            expires=expires_s,
        )

    def close(self) -> None:
        self._app.close()
