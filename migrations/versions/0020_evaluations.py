"""evaluations: the results of eval jobs, per evaluated checkpoint

Revision ID: 0020_evaluations
Revises: 0019_sweeps
Create Date: 2026-11-28 05:20:00

An eval job (`jobspec.job.EvalJobSpec`) writes one row per evaluation it ran: its scores and,
for `generate`, the answers beside their prompts and references. `source_job_id` is the job
whose checkpoint was evaluated (`GET /v1/jobs/{id}/evals` of either job lists them);
`checkpoint_id` is no foreign key, as retention may delete the checkpoint and its results stay.
A retried attempt replaces its evaluation's row (unique per eval job and name).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0020_evaluations"
down_revision: str | None = "0019_sweeps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", BigId, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "source_job_id",
            BigId,
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("dataset", sa.String(100), nullable=True),
        sa.Column("metrics", Json, nullable=False),
        sa.Column("samples", Json, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "name"),
    )
    op.create_index("ix_evaluations_source_job_id", "evaluations", ["source_job_id"])


def downgrade() -> None:
    op.drop_index("ix_evaluations_source_job_id", table_name="evaluations")
    op.drop_table("evaluations")
