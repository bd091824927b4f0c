"""Names shared across processes: Celery task names, queues, Redis keys, S3 key layout."""

from __future__ import annotations

import re
import secrets

# Celery task names (the API sends by name; it never imports workers).
TASK_RUN_JOB = "omniqueue.run_job"
TASK_RUN_SESSION = "omniqueue.run_session"

# Job id prefixes per kind.
ID_PREFIX = {"video": "video_", "audio": "audio_"}


def new_job_id(kind: str) -> str:
    """A fresh job id of ``kind``: its prefix and 96 random bits (``video_3f…``)."""
    return ID_PREFIX[kind] + secrets.token_hex(12)


# Owner of jobs created while auth is off.
LOCAL_OWNER = "local"

# Redis key prefixes (the broker uses its own ``celery``/``_kombu`` keys).
KEY_PREFIX = "oq:"


def job_queue(model: str) -> str:
    """The Celery queue a model's jobs go to: ``jobs.reference-video`` for ``reference/video``."""
    return "jobs." + re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-")


def realtime_queue(model: str) -> str:
    """The Celery queue realtime sessions of a model are placed on."""
    return "realtime." + re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-")


def job_prefix(kind: str, job_id: str) -> str:
    """S3 key prefix holding everything of one job: ``videos/{id}/``."""
    return f"{kind}s/{job_id}/"


def job_events_key(job_id: str) -> str:
    """Redis Stream of one job's events (status, progress, preview, chunk, done)."""
    return f"{KEY_PREFIX}job:{job_id}:events"


def session_in_key(session_id: str) -> str:
    """Commands API → worker of one realtime session."""
    return f"{KEY_PREFIX}session:{session_id}:in"


def session_out_key(session_id: str) -> str:
    """Outputs worker → API of one realtime session."""
    return f"{KEY_PREFIX}session:{session_id}:out"


def session_abandoned_key(session_id: str) -> str:
    """Set by the API when it gave up waiting for a slot: a late worker must not start."""
    return f"{KEY_PREFIX}session:{session_id}:abandoned"


def session_checkpoint_key(session_id: str) -> str:
    """A world session's checkpoint (hash, ``storage/session_checkpoint.py``): where it
    stood after its last chunk sent, from which another worker takes it over."""
    return f"{KEY_PREFIX}session:{session_id}:checkpoint"


def session_lease_key(session_id: str, attempt: int) -> str:
    """Held by the worker process running placement ``attempt`` of a realtime session
    while it lives (``workers/sessions/lease.py``): gone, that worker is dead."""
    return f"{KEY_PREFIX}session:{session_id}:lease:{attempt}"


def session_state_key(session_id: str, part: str) -> str:
    """The Redis-held state of one duplex realtime session (:mod:`storage.session_state`):
    ``holder`` (the API replica serving it), ``state`` (protocol snapshot), ``log`` (the
    numbered client-facing events), ``audio:{item_id}:{content_index}`` (PCM16)."""
    return f"{KEY_PREFIX}session:{session_id}:state:{part}"


def quota_sessions_key(owner: str) -> str:
    """Sorted set of one API key's connected realtime sessions (``api/quotas.py``):
    a member per socket, scored by when its lease expires."""
    return f"{KEY_PREFIX}quota:sessions:{owner}"


def presence_key(model: str) -> str:
    """Sorted set of the live workers of one model: a member per worker, scored by when
    its presence lease expires (``storage/worker_presence.py``)."""
    return f"{KEY_PREFIX}workers:{model}"


def load_failures_key(model: str) -> str:
    """Hash of why the workers that tried could not load one model, a field per worker."""
    return f"{KEY_PREFIX}workers:{model}:load-failures"


def memory_key(model: str) -> str:
    """What the live workers did with one model's memory plan (FP8 layers, bytes saved)."""
    return f"{KEY_PREFIX}workers:{model}:memory"
