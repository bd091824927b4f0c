"""typed job specs: ``spec`` replaces ``params``, audio gets ``duration_ms`` and ``output``

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 07:20:00

Rows written before this revision keep working: each row's ``params`` bag and columns
become its ``spec`` (the shape of ``models/job_specs.py`` as of this revision, spelled out
here so later model changes cannot change what this migration does). Audio rows stored
their length as milliseconds in the frame columns (``num_frames`` = ms, ``fps`` 1000,
width and height 0); they move to ``duration_ms`` and the frame columns become NULL. An
audio job's ``params["output"]`` (the artifact's real rate and channels) becomes its
``output``. The downgrade writes the old shape back.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Rows are rewritten in batches of this many (by id), so a large table is never held whole.
BATCH = 500
_FRAME_COLUMNS = ("width", "height", "fps", "num_frames")

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("kind", sa.String),
    sa.column("model", sa.String),
    sa.column("prompt", sa.Text),
    sa.column("seed", sa.BigInteger),
    sa.column("num_inference_steps", sa.Integer),
    sa.column("width", sa.Integer),
    sa.column("height", sa.Integer),
    sa.column("fps", sa.Float),
    sa.column("num_frames", sa.Integer),
    sa.column("has_audio", sa.Boolean),
    sa.column("params", sa.JSON),
    sa.column("spec", sa.JSON),
    sa.column("duration_ms", sa.Integer),
    sa.column("output", sa.JSON),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("spec", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("duration_ms", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("output", sa.JSON(), nullable=True))
        for name in _FRAME_COLUMNS:
            batch.alter_column(name, existing_type=_type(name), nullable=True)
    for row in _rows("params"):
        op.execute(jobs.update().where(jobs.c.id == row.id).values(**_to_spec(row)))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("spec", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("params")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("params", sa.JSON(), nullable=True))
    for row in _rows("spec", "duration_ms", "output"):
        op.execute(jobs.update().where(jobs.c.id == row.id).values(**_to_params(row)))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("params", existing_type=sa.JSON(), nullable=False)
        for name in _FRAME_COLUMNS:
            batch.alter_column(name, existing_type=_type(name), nullable=False)
        batch.drop_column("output")
        batch.drop_column("duration_ms")
        batch.drop_column("spec")


def _type(name: str) -> sa.types.TypeEngine[Any]:
    return sa.Float() if name == "fps" else sa.Integer()


def _rows(*extra: str) -> Iterator[sa.Row[Any]]:
    """Every job row with the columns a rewrite needs, BATCH at a time in id order."""
    conn = op.get_bind()
    shared = ("id", "kind", "model", "prompt", "seed", "num_inference_steps", "has_audio")
    cols = [jobs.c[n] for n in (*shared, *_FRAME_COLUMNS, *extra)]
    after = ""
    while True:
        batch = conn.execute(
            sa.select(*cols).where(jobs.c.id > after).order_by(jobs.c.id).limit(BATCH)
        ).all()
        yield from batch
        if len(batch) < BATCH:
            return
        after = batch[-1].id


def _to_spec(row: sa.Row[Any]) -> dict[str, Any]:
    """The new columns of a row written before this revision."""
    params: dict[str, Any] = dict(row.params or {})
    spec: dict[str, Any] = {
        "kind": row.kind,
        "model": row.model,
        "prompt": row.prompt,
        "seed": row.seed,
        "num_inference_steps": row.num_inference_steps,
        "timeout_s": params.get("timeout_s"),
        "negative_prompt": params.get("negative_prompt"),
        "options": dict(params.get("options") or {}),
        "extra": dict(params.get("extra") or {}),
    }
    if row.kind == "audio":
        duration_ms = max(1, int(row.num_frames or 1))
        spec |= {
            "duration_ms": duration_ms,
            "response_format": str(params.get("response_format") or "wav"),
            "sample_rate": params.get("sample_rate"),
            "channels": params.get("channels"),
            "stream_pcm": bool(params.get("stream_pcm")),
        }
        return {
            "spec": spec,
            "duration_ms": duration_ms,
            "output": params.get("output") or None,
            **dict.fromkeys(_FRAME_COLUMNS),
        }
    spec |= {
        "width": row.width,
        "height": row.height,
        "fps": row.fps,
        "num_frames": row.num_frames,
        "has_audio": bool(row.has_audio),
        "reference_key": params.get("reference_key"),
        "session_id": params.get("session_id"),
    }
    return {"spec": spec}


def _to_params(row: sa.Row[Any]) -> dict[str, Any]:
    """The 0001 columns of a row written at this revision."""
    spec: dict[str, Any] = dict(row.spec)
    params: dict[str, Any] = {
        "negative_prompt": spec.get("negative_prompt"),
        "options": spec.get("options") or {},
        "extra": spec.get("extra") or {},
        "timeout_s": spec.get("timeout_s"),
    }
    if row.kind == "audio":
        ms = int(row.duration_ms or spec["duration_ms"])
        params |= {
            "seconds": f"{ms / 1000:g}",
            "response_format": spec.get("response_format") or "wav",
            "sample_rate": spec.get("sample_rate"),
            "channels": spec.get("channels"),
            "stream_pcm": bool(spec.get("stream_pcm")),
        }
        if row.output:
            params["output"] = row.output
        return {"params": params, "width": 0, "height": 0, "fps": 1000.0, "num_frames": ms}
    params["seconds"] = f"{row.num_frames / row.fps:g}"
    for key in ("reference_key", "session_id"):
        if spec.get(key):
            params[key] = spec[key]
    return {"params": params}
