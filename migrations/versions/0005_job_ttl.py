"""jobs.ttl_s: how long a job may wait in the queue before it ends ``ttl_expired``

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 01:00:00

One nullable column; existing rows keep NULL (no limit), so no row is rewritten.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("ttl_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # SQLite rebuilds the table
        batch.drop_column("ttl_s")
