"""per-key quotas and the indexes of quotas and fair share

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 16:40:00

``api_keys`` gets three nullable quota columns (NULL: the server default
``OMNIQ_QUOTAS__*``; 0: unlimited for this key). ``jobs`` gets two indexes: ``(owner,
status)`` answers a key's active-job count (its ``max_active_jobs`` quota) and its running
jobs (fair share) from the index alone, and ``(owner, model, started_at)`` a key's last
start on a model (fair share picks the key served longest ago). Existing rows need no
rewrite: every key starts on the server defaults.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY_COLUMNS = ("creates_per_minute", "max_active_jobs", "max_sessions")


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        for name in _KEY_COLUMNS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))
    op.create_index("ix_jobs_owner_status", "jobs", ["owner", "status"])
    op.create_index("ix_jobs_owner_model_started", "jobs", ["owner", "model", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_model_started", table_name="jobs")
    op.drop_index("ix_jobs_owner_status", table_name="jobs")
    with op.batch_alter_table("api_keys") as batch:
        for name in reversed(_KEY_COLUMNS):
            batch.drop_column(name)
