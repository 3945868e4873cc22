"""quotas: per project and pool limits and fair-share weights; jobs.wait_reason

Revision ID: 0014_quotas
Revises: 0013_usage
Create Date: 2026-11-25 11:50:00

`quotas` has one row per (project, pool); pool "*" limits a project on every pool together.
`jobs.wait_reason` is why the scheduler last passed a queued job over (core.scheduling.claim).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_quotas"
down_revision: str | None = "0013_usage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column(
            "project_id",
            sa.String(40),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("pool", sa.String(100), primary_key=True),
        sa.Column("max_slots", sa.Integer(), nullable=True),
        sa.Column("max_running_jobs", sa.Integer(), nullable=True),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.Column("monthly_slot_hours", sa.Float(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False, server_default="1"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("wait_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("wait_reason")
    op.drop_table("quotas")
