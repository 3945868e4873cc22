"""job note and best losses: jobs.note, jobs.best_loss, jobs.best_eval_loss

Revision ID: 0016_job_note
Revises: 0015_identity
Create Date: 2026-11-25 12:20:00

`note` is a free-text note set with `PATCH /v1/jobs/{id}`. `best_loss` / `best_eval_loss` are
the lowest finite `loss` / `eval_loss` reported so far, kept at ingest (core.jobs.upserts) so the
jobs list shows them without reading metric points; existing jobs get them from their points.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_job_note"
down_revision: str | None = "0015_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BACKFILL = (
    "UPDATE jobs SET {column} = (SELECT min(m.value) FROM metric_points m"
    " WHERE m.job_id = jobs.id AND m.name = '{series}'"
    " AND m.value > '-Infinity' AND m.value < 'Infinity')"
)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))
        batch.add_column(sa.Column("best_loss", sa.Float(), nullable=True))
        batch.add_column(sa.Column("best_eval_loss", sa.Float(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":  # SQLite test databases start empty
        op.execute(_BACKFILL.format(column="best_loss", series="loss"))
        op.execute(_BACKFILL.format(column="best_eval_loss", series="eval_loss"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("best_eval_loss")
        batch.drop_column("best_loss")
        batch.drop_column("note")
