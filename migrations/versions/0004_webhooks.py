"""webhooks: per-key endpoints and signing secrets, the delivery outbox and its attempts

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 16:45:00

Only new tables, and an index on ``jobs.completed_at`` for the sender's sweep of
recently ended jobs (storage/outbox.py). A job's own ``webhook_url`` lives in its
``spec`` (models/job_specs.py), so job rows are not rewritten. The downgrade drops what
the upgrade made; undelivered events are lost with it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_TYPES = {"int": sa.Integer, "float": sa.Float, "text": sa.Text, "json": sa.JSON}


def _columns(spec: str) -> list[sa.Column]:
    """``name:type`` words → columns, frozen here (the models may change, this may not):
    ``type`` is int, float, text, json or strN (``String(N)``); a trailing ``?`` makes
    the column nullable."""
    out = []
    for word in spec.split():
        name, kind = word.split(":")
        nullable, kind = kind.endswith("?"), kind.rstrip("?")
        made = sa.String(length=int(kind[3:])) if kind.startswith("str") else _TYPES[kind]()
        out.append(sa.Column(name, made, nullable=nullable))
    return out


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        *_columns("id:str40 owner:str40 url:str2048 events:json? created_at:float"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_endpoints_owner", "webhook_endpoints", ["owner"])
    op.create_table(
        "webhook_secrets",
        *_columns("owner:str40 secret:str100 previous_secret:str100? rotated_at:float?"),
        *_columns("created_at:float"),
        sa.PrimaryKeyConstraint("owner"),
    )
    op.create_table(
        "webhook_deliveries",
        *_columns("id:int event_id:str40 event_type:str32 job_id:str64 owner:str40"),
        *_columns("url:str2048 payload:text status:str16 attempts:int next_attempt_at:float"),
        *_columns("claim_token:str32? created_at:float finished_at:float?"),
        *_columns("last_status_code:int? last_error:text?"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("event_id", "url", name="uq_webhook_deliveries_event_url"),
    )
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"]
    )
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"])
    op.create_table(
        "webhook_attempts",
        *_columns("id:int delivery_id:int attempt:int started_at:float duration_s:float"),
        *_columns("status_code:int? error:text? outcome:str16"),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts", ["delivery_id"])
    op.create_index("ix_jobs_completed_at", "jobs", ["completed_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_completed_at", table_name="jobs")
    op.drop_index("ix_webhook_attempts_delivery_id", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_job_id", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_secrets")
    op.drop_index("ix_webhook_endpoints_owner", table_name="webhook_endpoints")
    op.drop_table("webhook_endpoints")
