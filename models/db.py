"""SQLAlchemy ORM tables: API keys, jobs and their artifacts, webhooks.

The database is the source of truth for job state. Every state transition is a
conditional UPDATE (see :mod:`storage.jobs`), so columns here carry no behaviour.
Types are portable: the same schema runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, TypeAlias

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Re-exported: both were defined here; they live with the wire models and the error tree.
from models.common import JobStatus as JobStatus
from models.errors import ErrorCode as ErrorCode
from models.job_specs import AudioJobOutput, AudioSpec, VideoSpec, parse_spec


class Base(DeclarativeBase):
    pass


TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    # First characters of the secret, shown in listings to tell keys apart.
    prefix: Mapped[str] = mapped_column(String(16))
    # sha256 of the whole key; the key itself is never stored.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Per-key quotas (``api/quotas.py``): NULL takes the server default
    # (``OMNIQ_QUOTAS__*``), 0 means unlimited for this key.
    creates_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_active_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_sessions: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_owner_created", "owner", "created_at", "id"),
        Index("ix_jobs_status_model_created", "status", "model", "created_at"),
        # A key's active jobs (its ``max_active_jobs`` quota, its running jobs of a model
        # under fair share): one index range, no table rows.
        Index("ix_jobs_owner_status", "owner", "status"),
        # A key's last start on a model (fair share: the key served longest ago goes first).
        Index("ix_jobs_owner_model_started", "owner", "model", "started_at"),
        # the webhook sender's sweep of recently ended jobs (storage/outbox.py)
        Index("ix_jobs_completed_at", "completed_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="video")
    # The API key id that created the job ("local" when auth is off).
    owner: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    error_code: Mapped[str | None] = mapped_column(String(32), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)

    # What the worker runs: a :mod:`models.job_specs` spec (``kind`` says which), written
    # once by :meth:`new`. The columns below copy what lists, reads and queries need.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    prompt: Mapped[str] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(BigInteger)
    num_inference_steps: Mapped[int] = mapped_column(Integer)
    # Video jobs: the clip's shape (NULL for audio).
    width: Mapped[int | None] = mapped_column(Integer, nullable=True)
    height: Mapped[int | None] = mapped_column(Integer, nullable=True)
    fps: Mapped[float | None] = mapped_column(Float, nullable=True)
    num_frames: Mapped[int | None] = mapped_column(Integer, nullable=True)
    has_audio: Mapped[bool] = mapped_column(Boolean, default=False)
    # Audio jobs: the clip's length (NULL for video).
    duration_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What the worker made, once completed (audio: an :class:`AudioJobOutput`).
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    progress: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int] = mapped_column(Integer, default=0)
    stage: Mapped[str] = mapped_column(String(16), default="queue")
    stage_durations: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    inference_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)

    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    completed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Absolute deadline (Unix seconds) after which the worker fails the job with ``timeout``.
    deadline_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The job's ``ttl`` (seconds from ``created_at``): still queued after it, the job ends
    # ``ttl_expired`` without running (a running job is not touched). NULL: none.
    ttl_s: Mapped[int | None] = mapped_column(Integer, nullable=True)

    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    artifacts: Mapped[list[Artifact]] = relationship(
        back_populates="job", cascade="all, delete-orphan", passive_deletes=True
    )

    @classmethod
    def new(
        cls,
        spec: VideoSpec | AudioSpec,
        *,
        id: str,
        owner: str,
        idempotency_key: str | None = None,
        **state: Any,
    ) -> Job:
        """The one way to build a job row: a queued job of ``spec``; ``state`` overrides
        the state columns of a job that starts elsewhere (a persisted session is stored
        ``completed``)."""
        now = time.time()
        shape: dict[str, Any]
        if isinstance(spec, VideoSpec):
            shape = {
                "width": spec.width,
                "height": spec.height,
                "fps": spec.fps,
                "num_frames": spec.num_frames,
                "has_audio": spec.has_audio,
            }
        else:
            shape = {"duration_ms": spec.duration_ms, "has_audio": True}
        values: dict[str, Any] = {
            "status": JobStatus.QUEUED.value,
            "progress": 0,
            "step": 0,
            "stage": "queue",
            "stage_durations": {},
            "created_at": now,
            "attempt": 0,
            "cancel_requested": False,
        }
        values.update(state)
        return cls(
            id=id,
            kind=spec.kind,
            owner=owner,
            model=spec.model,
            spec=spec.model_dump(mode="json"),
            prompt=spec.prompt,
            seed=spec.seed,
            num_inference_steps=spec.num_inference_steps,
            idempotency_key=idempotency_key,
            ttl_s=spec.ttl_s,
            **shape,
            **values,
        )


class JobRecord(SimpleNamespace):
    """A read-only copy of a ``jobs`` row, attributes named as on :class:`Job`: what
    status reads and list pages build the wire from (:meth:`storage.jobs.JobStore.read`).
    No ORM identity map or instance state, and attribute reads at ``__dict__`` speed
    (a SQLAlchemy ``Row``'s are ~50x slower, a fifth of a list page's CPU)."""


# A job as the API reads it for the wire.
JobView: TypeAlias = "Job | JobRecord"


def job_spec(job: JobView) -> VideoSpec | AudioSpec:
    """The job's typed spec (parsed on each call; video status reads need none)."""
    return parse_spec(job.spec)


def audio_output(job: JobView) -> AudioJobOutput | None:
    """What an audio job made, once it has completed."""
    return None if job.output is None else AudioJobOutput.model_validate(job.output)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("job_id", "variant", name="uq_artifacts_job_variant"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    # ``video``, ``thumbnail``, ``input`` …
    variant: Mapped[str] = mapped_column(String(32))
    bucket: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(1024))
    content_type: Mapped[str] = mapped_column(String(100))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)

    job: Mapped[Job] = relationship(back_populates="artifacts")


# ---- webhooks (storage/webhooks.py, storage/outbox.py, docs/webhooks.md) -----------------


class WebhookEndpoint(Base):
    """A destination of every event of an API key's jobs (``omniqueue webhooks add``)."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # The API key id ("local" when auth is off).
    owner: Mapped[str] = mapped_column(String(40), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    # Event types sent there; NULL: all.
    events: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class WebhookSigningSecret(Base):
    """An API key's signing secret (``whsec_…``; "local": the server's, with auth off).
    Stored as it is: signing needs the secret itself, not a hash of it."""

    __tablename__ = "webhook_secrets"

    owner: Mapped[str] = mapped_column(String(40), primary_key=True)
    secret: Mapped[str] = mapped_column(String(100))
    # The one before the last rotation: it still signs until ``rotated_at`` + the grace.
    previous_secret: Mapped[str | None] = mapped_column(String(100), nullable=True)
    rotated_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class WebhookDelivery(Base):
    """One event for one destination URL (the outbox): ``pending`` until a sender gets a
    2xx (``delivered``) or gives up (``failed``). ``payload`` is the exact body, the same
    bytes on every attempt; ``event_id`` is its ``webhook-id``. No foreign key to the job:
    the event of a deleted job is still delivered."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "url", name="uq_webhook_deliveries_event_url"),
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(40))
    event_type: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(String(64), index=True)
    owner: Mapped[str] = mapped_column(String(40))
    url: Mapped[str] = mapped_column(String(2048))
    payload: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When a sender may take it next; a claim moves it past the attempt's lease.
    next_attempt_at: Mapped[float] = mapped_column(Float)
    # The sender's claim of the attempt in flight (NULL when none).
    claim_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class WebhookAttempt(Base):
    """One POST of a delivery and how it went."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    duration_s: Mapped[float] = mapped_column(Float)
    # The receiver's status, or NULL when there was none (timeout, refused, no route).
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # ``delivered``, ``retry`` or ``failed`` (docs/webhooks.md, "Retries").
    outcome: Mapped[str] = mapped_column(String(16))
