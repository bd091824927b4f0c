"""SQLAlchemy ORM tables: API keys, jobs and their artifacts.

The database is the source of truth for job state. Every state transition is a
conditional UPDATE (see :mod:`storage.jobs`), so columns here carry no behaviour.
Types are portable: the same schema runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

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
from sqlalchemy.engine import Row
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Re-exported: both were defined here; they live with the wire models and the error tree.
from models.common import JobStatus as JobStatus
from models.errors import ErrorCode as ErrorCode


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


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_owner_created", "owner", "created_at", "id"),
        Index("ix_jobs_status_model_created", "status", "model", "created_at"),
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

    prompt: Mapped[str] = mapped_column(Text)
    # The full normalized request, as the worker needs it.
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    fps: Mapped[float] = mapped_column(Float)
    num_frames: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    num_inference_steps: Mapped[int] = mapped_column(Integer)
    has_audio: Mapped[bool] = mapped_column(Boolean, default=False)

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

    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    artifacts: Mapped[list[Artifact]] = relationship(
        back_populates="job", cascade="all, delete-orphan", passive_deletes=True
    )


# A job as the API reads it for the wire: an ORM ``Job``, or a Core row of the ``jobs``
# table with the same attribute names (status reads and list pages skip the ORM's
# identity map and instance state: :meth:`storage.jobs.JobStore.read`).
JobView: TypeAlias = "Job | Row[Any]"


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
